"""`streamdi airflow`: run Airflow (`airflow standalone`) on this machine with streamdi's DAGs.

Everything Airflow keeps lives under `<STREAMDI_HOME>/airflow` (AIRFLOW_HOME): its configuration, logs and, unless
`AIRFLOW__DATABASE__SQL_ALCHEMY_CONN` says otherwise (e.g. a PostgreSQL URL), a SQLite metadata database. The API
server and UI listen on 127.0.0.1 only. Login is the simple auth manager's user `admin`, whose password is
generated once and kept in `<AIRFLOW_HOME>/simple_auth_manager_passwords.json.generated`; it is printed at start.

Every `AIRFLOW__*` variable already set in the environment wins over the values chosen here.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from streamdi.settings import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
DAGS_FOLDER = REPO / "dags"
PLUGINS_FOLDER = DAGS_FOLDER / "plugins"
USER = "admin"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"


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
    """Print the URL and login, then replace this process with `airflow standalone` (scheduler, DAG processor,
    triggerer and API server with the UI). With `dry_run`, print the environment instead and return 0."""
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
    os.execve(airflow, [airflow, "standalone"], env)
    return 0  # not reached


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
