"""`streamdi airflow`: run Airflow (`airflow standalone`) on this machine with streamdi's DAGs.

Everything Airflow keeps lives under `<STREAMDI_HOME>/airflow` (AIRFLOW_HOME): its configuration, logs and, unless
`AIRFLOW__DATABASE__SQL_ALCHEMY_CONN` says otherwise (e.g. a PostgreSQL URL), a SQLite metadata database. The API
server and UI listen on 127.0.0.1 only. Login is the simple auth manager's user `admin`, whose password is
generated once and kept in `<AIRFLOW_HOME>/simple_auth_manager_passwords.json.generated`; it is printed at start.

Every `AIRFLOW__*` variable already set in the environment wins over the values chosen here.

Stopping: Ctrl-C (or SIGTERM) stops Airflow within seconds. `airflow standalone` runs in a process group of its own and
only it is told to stop, as it expects: a Ctrl-C that reached every process of the group also reached the
scheduler's LocalExecutor workers, and Airflow 3.3's scheduler then never ended (seen: still running 120 s later).
A second Ctrl-C, or `STOP_GRACE` seconds without an exit, ends every process of the group.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from streamdi.settings import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
DAGS_FOLDER = REPO / "dags"
PLUGINS_FOLDER = DAGS_FOLDER / "plugins"
USER = "admin"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
STOP_GRACE = 60.0  # seconds `airflow standalone` gets to stop its components after Ctrl-C or SIGTERM
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def airflow_home(settings: Settings) -> Path:
    return (settings.home / "airflow").absolute()


def ensure_login(home: Path) -> str:
    """The admin password: read from the simple auth manager's password file, or generated and written there."""
    path = home / PASSWORDS_FILE
    passwords = json.loads(path.read_text() or "{}") if path.exists() else {}
    if USER not in passwords:
        passwords[USER] = secrets.token_urlsafe(12)
        home.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(passwords) + "\n")
        tmp.chmod(0o600)
        tmp.replace(path)
    return passwords[USER]


def airflow_environment(settings: Settings, port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `airflow standalone` runs with: `base` (default: this process's) plus streamdi's defaults."""
    env = dict(os.environ if base is None else base)
    home = airflow_home(settings)
    url = f"http://127.0.0.1:{port}"
    defaults = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / PASSWORDS_FILE),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__API__WORKERS": "1",
        # Each task starts a Spark driver; two at a time is what a small machine takes.
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    # Tasks run in fresh processes and read streamdi's settings from the environment: pin the home they share.
    env["STREAMDI_HOME"] = str(settings.home.absolute())
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def run_airflow(settings: Settings, port: int = 8080, *, dry_run: bool = False) -> int:
    """Print the URL and login, then run `airflow standalone` (scheduler, DAG processor, triggerer and API server
    with the UI) until Ctrl-C or SIGTERM; returns its exit status. With `dry_run`, print the environment instead and
    return 0."""
    env = airflow_environment(settings, port)
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    password = ensure_login(Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).parent)
    url = env["AIRFLOW__API__BASE_URL"]
    print(f"Airflow UI: {url}  (login: {USER} / {password})", flush=True)
    print(f"AIRFLOW_HOME={home}  DAGs: {env['AIRFLOW__CORE__DAGS_FOLDER']}", flush=True)
    print(f"metadata database: {env['AIRFLOW__DATABASE__SQL_ALCHEMY_CONN'].split('@')[-1]}", flush=True)
    if dry_run:
        for key in sorted(k for k in env if k.startswith(("AIRFLOW", "STREAMDI_"))):
            print(f"{key}={env[key]}")
        return 0
    airflow = shutil.which("airflow", path=env["PATH"])
    if airflow is None:
        raise RuntimeError("the `airflow` command is not installed next to this Python")
    print("starting `airflow standalone` (Ctrl-C stops it; the UI is ready about a minute after start)", flush=True)
    return supervise([airflow, "standalone"], env)


def supervise(command: list[str], env: dict[str, str], grace: float = STOP_GRACE) -> int:
    """Run `command` in a session (process group) of its own and wait for it. Ctrl-C, SIGTERM or SIGHUP here is
    passed on as one SIGINT to that process alone; a second one, or `grace` seconds without an exit, kills its whole
    group. Whatever it leaves running in its group when it exits gets SIGTERM. The child dies with this process
    (Linux: parent-death signal, a SIGINT), so a `kill -9` here leaves no Airflow behind. Returns its exit status (128 +
    the signal number when a signal ended it)."""
    stops: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: stops.append(signum)) for sig in STOP_SIGNALS}
    try:
        process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent)
        told = 0  # how many stop signals were passed on
        deadline = None
        while process.poll() is None:
            if len(stops) > told:
                if told == 0:
                    print("stopping Airflow (Ctrl-C again to kill it at once) ...", file=sys.stderr, flush=True)
                    _signal(process.pid, signal.SIGINT, group=False)
                    deadline = time.monotonic() + grace
                if len(stops) > 1:  # a second stop, also one that came within the same poll as the first
                    _signal(process.pid, signal.SIGKILL, group=True)
                told = len(stops)
            elif deadline is not None and time.monotonic() > deadline:
                print(f"Airflow did not stop within {grace:.0f} s: killing it", file=sys.stderr, flush=True)
                _signal(process.pid, signal.SIGKILL, group=True)
                deadline = None
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.2)
        _signal(process.pid, signal.SIGTERM, group=True)  # what it left behind in its group, if anything
        return process.returncode if process.returncode >= 0 else 128 - process.returncode
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal(pid: int, sig: int, *, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


def _die_with_parent() -> None:
    """In the child before exec: SIGINT (its Ctrl-C) when the parent dies (prctl PR_SET_PDEATHSIG; Linux only)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # 1 = PR_SET_PDEATHSIG


def airflow_command(
    port: Annotated[int, typer.Option(help="Port of the Airflow UI and API on 127.0.0.1.", min=1, max=65535)] = 8080,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the URL, login and Airflow environment, start nothing.")
    ] = False,
) -> None:
    """Start Airflow with streamdi's DAGs (`airflow standalone` on 127.0.0.1, state under <STREAMDI_HOME>/airflow)
    and print the URL and the login."""
    raise typer.Exit(run_airflow(load_settings(), port, dry_run=dry_run))


app = typer.Typer(add_completion=False)
app.command("airflow")(airflow_command)

if __name__ == "__main__":
    app()
