"""A warm Spark for every process: an embedded Spark Connect server per STREAMDI_HOME (`spark_remote`).

Each `streamdi` command and each Airflow task is a new process; with Spark in the process each pays a JVM start and
meets a cold JIT, and the Airflow DAGs run every transaction step (T0..T4, DM) as a task of its own. Spark Connect
(part of Spark 4; the pyspark wheel ships its server) runs the JVM as a server that outlives its clients: with
`STREAMDI_SPARK_REMOTE=embedded` the first process starts one, like the embedded PostgreSQL server, and every later
process of the same home connects to it (`sc://127.0.0.1:<port>`); `STREAMDI_SPARK_REMOTE=sc://host:port` uses a
server run elsewhere; `off` keeps Spark in each process. Unset, Airflow tasks use `embedded` (`task_settings`) and
other processes use the embedded server when one is running for their home, else Spark in the process
(`address`). streamdi's jobs use only the DataFrame API, so they run unchanged on either; Delta commits stay in the
client (delta-rs), so exactly-once does not depend on the server.

The server's state is `<home>/spark-connect/server.json` (pid, port) and its output `server.log`. A process that
finds no live server starts one under a file lock (two first starts do not race), with the driver options a
process-local session gets (`streamdi.spark_options`), and a watchdog process (`watch`) that stops it once no
client has been connected, nor been handed its address, for `spark_idle_timeout` seconds. `stop_server`
(`streamdi spark stop`) stops it at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from streamdi.locks import flocked
from streamdi.settings import Settings

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
OFF = "off"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180.0


def folder(settings: Settings) -> Path:
    return settings.home.absolute() / "spark-connect"


LAST_USE = "last-use"  # touched whenever a process is handed the embedded server's address
WATCH_EVERY = 5.0  # seconds between two looks of the watchdog


def task_settings(settings: Settings) -> Settings:
    """The settings of an Airflow task: `spark_remote` unset means the embedded server (a task is a short process,
    and the DAGs run every transaction step as a task, each of which would otherwise start a JVM)."""
    return settings if settings.spark_remote else settings.model_copy(update={"spark_remote": EMBEDDED})


def address(settings: Settings) -> str | None:
    """The `sc://` address the sessions of `settings` connect to, or None for Spark in the process: `embedded`
    starts this home's server when needed; unset uses it only when it is running already."""
    if settings.spark_remote == OFF:
        return None
    if settings.spark_remote == EMBEDDED:
        return ensure_server(settings)
    if settings.spark_remote:
        return settings.spark_remote
    return running_address(settings)


def running_address(settings: Settings) -> str | None:
    """The address of this home's embedded server if it is running (nothing is started), else None."""
    if not (folder(settings) / "server.json").exists():
        return None
    with _locked(settings):
        state = _state(settings)
        if not _alive(state):
            return None
        _touch(settings)
        return f"sc://127.0.0.1:{state['port']}"


def _touch(settings: Settings) -> None:
    (folder(settings) / LAST_USE).touch()


KEEP_ALIVE_EVERY = 60.0
_kept_alive: set[Path] = set()


def keep_alive(settings: Settings, every: float = KEEP_ALIVE_EVERY) -> None:
    """Mark this home's embedded server as in use every `every` seconds while this process lives (a daemon
    thread): a client busy with other work for longer than the idle timeout (staging, a migration) keeps its
    server and its session. Once per process and home."""
    where = folder(settings)
    if where in _kept_alive:
        return
    _kept_alive.add(where)

    def mark() -> None:
        while True:
            time.sleep(every)
            with contextlib.suppress(OSError):
                (where / LAST_USE).touch()

    threading.Thread(target=mark, name="spark-connect-keep-alive", daemon=True).start()


def _state(settings: Settings) -> dict | None:
    try:
        return json.loads((folder(settings) / "server.json").read_text())
    except (OSError, ValueError):
        return None


def running(pid: int) -> bool:
    """The process exists and has not exited (an exited child not yet reaped is a zombie: not running)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _alive(state: dict | None) -> bool:
    if not state or not isinstance(state.get("pid"), int) or not running(state["pid"]):
        return False
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", state["port"]), timeout=2):
        return True
    return False


def _locked(settings: Settings):
    return flocked(folder(settings) / ".lock")


def ensure_server(settings: Settings) -> str:
    """The address of this home's embedded Spark Connect server, started first if none is running."""
    with _locked(settings):
        state = _state(settings)
        if _alive(state):
            _touch(settings)
            return f"sc://127.0.0.1:{state['port']}"
        address = _start(settings)
        _touch(settings)
        return address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(settings: Settings) -> str:
    from streamdi.java import find_java
    from streamdi.spark_options import jvm_options, server_options, spark_submit

    runtime = find_java()
    port = _free_port()
    options = {
        **server_options(settings),
        "spark.driver.extraJavaOptions": jvm_options(settings, runtime),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
    }
    command = [spark_submit(), "--master", settings.spark_master, "--name", "streamdi Spark Connect"]
    for key, value in options.items():
        command += ["--conf", f"{key}={value}"]
    command += ["--class", SERVER_CLASS, "spark-internal"]
    env = {**os.environ, "JAVA_HOME": str(runtime.home), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)  # the server's Python workers (the stage's large parses) import us
    for key in ("SPARK_CONNECT_MODE", "SPARK_REMOTE", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(key, None)
    log_path = folder(settings) / "server.log"
    log.info("starting the embedded Spark Connect server for %s on 127.0.0.1:%d", settings.home, port)
    with log_path.open("ab") as output:
        server = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
        )
    state = {"pid": server.pid, "port": port, "started": time.time()}
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(
                f"the embedded Spark Connect server exited with {server.returncode}; last lines of {log_path}:\n"
                + _tail(log_path)
            )
        if _alive(state):
            (folder(settings) / "server.json").write_text(json.dumps(state))
            log.info("embedded Spark Connect server is running (pid %d, port %d)", server.pid, port)
            if settings.spark_idle_timeout > 0:
                _start_watchdog(settings, state, log_path)
            return f"sc://127.0.0.1:{port}"
        time.sleep(0.25)
    with contextlib.suppress(OSError):
        os.killpg(server.pid, signal.SIGTERM)
    raise RuntimeError(f"the embedded Spark Connect server did not listen within {START_TIMEOUT:.0f} s; see {log_path}")


def stop_server(settings: Settings, timeout: float = 60) -> bool:
    """Stop this home's embedded server; True when one was running."""
    with _locked(settings):
        state = _state(settings)
        (folder(settings) / "server.json").unlink(missing_ok=True)
        if not _alive(state):
            return False
        log.info("stopping the embedded Spark Connect server (pid %d)", state["pid"])
        _terminate(state["pid"], timeout)
        return True


def _start_watchdog(settings: Settings, state: dict, log_path: Path) -> None:
    """A process of its own (it outlives the caller, as the server does) that runs `watch` for this server."""
    env = {**os.environ, "STREAMDI_HOME": str(settings.home.absolute())}
    command = [sys.executable, "-m", "streamdi.spark_connect", "watch", str(state["pid"]), str(state["port"])]
    command.append(str(settings.spark_idle_timeout))
    with log_path.open("ab") as output:
        subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
        )


def connections(port: int) -> int:
    """Established TCP connections to `port` on this machine (the server's clients; their gRPC channel stays open
    while the process lives)."""
    import psutil

    return sum(
        1
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port
    )


def idle_for(settings: Settings, port: int, now: float, last_active: float) -> float:
    """Seconds the server on `port` has been idle at `now`: 0 while a client is connected, else the time since the
    later of `last_active` (the last look that saw a client) and the last time a process was handed its address."""
    if connections(port):
        return 0.0
    with contextlib.suppress(OSError):
        last_active = max(last_active, (folder(settings) / LAST_USE).stat().st_mtime)
    return max(0.0, now - last_active)


def watch(settings: Settings, pid: int, port: int, timeout: float, every: float = WATCH_EVERY) -> str:
    """Stop this home's server `pid` once it has been idle for `timeout` seconds (`idle_for`); return why the watch
    ended. Ends without stopping anything when the server exits, or when another server replaced it."""
    last_active = time.time()
    while running(pid):
        now = time.time()
        idle = idle_for(settings, port, now, last_active)
        if idle == 0:
            last_active = now
        elif idle >= timeout:
            with _locked(settings):
                state = _state(settings)
                if not state or state.get("pid") != pid:
                    return "replaced"
                # a process may have been handed the address since the look above (under the same lock)
                if idle_for(settings, port, time.time(), last_active) < timeout:
                    continue
                (folder(settings) / "server.json").unlink(missing_ok=True)
            log.info("the embedded Spark Connect server (pid %d) was idle for %.0f s: stopping it", pid, idle)
            _terminate(pid)
            return "stopped"
        time.sleep(every)
    return "exited"


def _terminate(pid: int, timeout: float = 60) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> None:
    """The command line of the watchdog: `python -m streamdi.spark_connect watch PID PORT TIMEOUT` (started by
    `_start`, not by users). typer is imported here: a Spark start imports this module and need not pay for it."""
    import typer

    from streamdi.scripts import script_app

    app = script_app(no_args_is_help=True)

    @app.callback()
    def commands() -> None:
        """The embedded Spark Connect server's helper processes."""

    @app.command("watch")
    def watch_command(
        pid: int = typer.Argument(..., help="the server's process id"),
        port: int = typer.Argument(..., help="the server's port"),
        timeout: float = typer.Argument(..., help="seconds of idleness after which the server stops"),
    ) -> None:
        """Stop the server after TIMEOUT idle seconds; end when the server ends."""
        from streamdi.settings import load_settings

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        ended = watch(load_settings(), pid, port, timeout)
        log.info("watchdog of the embedded Spark Connect server (pid %s): %s", pid, ended)

    app(args=argv)


if __name__ == "__main__":
    main()
