"""A warm Spark for every process: an embedded Spark Connect server per STREAMDI_HOME (opt-in, `spark_remote`).

Each `streamdi` command and each Airflow task is a new process; with Spark in the process (the default) each pays a
JVM start and meets a cold JIT: at SF 3 a dripped Batch2's T2 takes ~15-19 s in a new process and ~7 s warm. Spark
Connect (part of Spark 4; the pyspark wheel ships its server) runs the JVM as a server that outlives its clients:
`STREAMDI_SPARK_REMOTE=embedded` starts one on first use, like the embedded PostgreSQL server, and every later
process of the same home connects to it (`sc://127.0.0.1:<port>`); `STREAMDI_SPARK_REMOTE=sc://host:port` uses a
server run elsewhere. streamdi's jobs use only the DataFrame API, so they run unchanged on either; Delta commits stay
in the client (delta-rs), so exactly-once does not depend on the server.

The server's state is `<home>/spark-connect/server.json` (pid, port) and its output `server.log`. A process that
finds no live server starts one under a file lock (two first starts do not race), with the driver options a
process-local session gets (`streamdi.spark_options`). `stop_server` (`streamdi spark stop`) stops it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from streamdi.settings import Settings

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180.0


def folder(settings: Settings) -> Path:
    return settings.home.absolute() / "spark-connect"


def address(settings: Settings) -> str:
    """The `sc://` address the sessions of `settings` connect to (an embedded server is started when needed)."""
    if settings.spark_remote == EMBEDDED:
        return ensure_server(settings)
    return settings.spark_remote


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


@contextlib.contextmanager
def _locked(settings: Settings):
    folder(settings).mkdir(parents=True, exist_ok=True)
    with open(folder(settings) / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_server(settings: Settings) -> str:
    """The address of this home's embedded Spark Connect server, started first if none is running."""
    with _locked(settings):
        state = _state(settings)
        if _alive(state):
            return f"sc://127.0.0.1:{state['port']}"
        return _start(settings)


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
        with contextlib.suppress(OSError):
            os.killpg(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not running(state["pid"]):
                return True
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            os.killpg(state["pid"], signal.SIGKILL)
        return True


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
