"""STREAMDI_SPARK_REMOTE=embedded: `streamdi load` processes run their Spark work (the executors' parse of large
files, here every file: `STREAMDI_EXECUTOR_PARSE_BYTES=0`) on this home's embedded Spark Connect server, which the
first one starts and later ones reuse, and build the same warehouse as Spark in the process does (every Delta table,
every row: the jobs use only the DataFrame API)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from snapshots import delta_warehouse
from test_cli_run import cli, pg_snapshot

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REMOTE = {"STREAMDI_SPARK_REMOTE": "embedded"}
PARSED_BY_SPARK = {"STREAMDI_EXECUTOR_PARSE_BYTES": "0", "STREAMDI_EXECUTOR_PARSE_CHUNK_BYTES": str(64 << 10)}


def _running(pid: int) -> bool:
    """Linux: the process exists and is not a zombie."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def homes(tmp_path: Path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    yield local, remote
    cli(remote, "spark", "stop", extra_env=REMOTE, timeout=120)
    if not os.environ.get("DATABASE_URL"):
        for home in (local, remote):
            cli(home, "db", "stop", timeout=120)


def test_loads_on_the_embedded_server_equal_loads_with_spark_in_the_process(homes, tmp_path: Path):
    local, remote = homes
    data = tmp_path / "data"
    made = cli(tmp_path, "generate", "--sf", "0.001", "--batches", "2", "--out", str(data))
    assert made.returncode == 0, made.stderr

    for batch in (1, 2):
        ran = cli(local, "load", "--data", str(data), "--batch", str(batch), extra_env=PARSED_BY_SPARK)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    first = cli(remote, "load", "--data", str(data), "--batch", "1", extra_env={**REMOTE, **PARSED_BY_SPARK})
    assert first.returncode == 0, first.stdout + first.stderr
    state = json.loads((remote / "spark-connect" / "server.json").read_text())
    assert _running(state["pid"])  # the server outlives the process that started it
    second = cli(remote, "load", "--data", str(data), "--batch", "2", extra_env={**REMOTE, **PARSED_BY_SPARK})
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads((remote / "spark-connect" / "server.json").read_text()) == state  # reused, not restarted
    assert not (local / "spark-connect").exists()

    assert delta_warehouse(remote) == delta_warehouse(local)
    assert pg_snapshot(remote) == pg_snapshot(local)

    stopped = cli(remote, "spark", "stop", extra_env=REMOTE)
    assert "stopped" in stopped.stdout
    assert not _running(state["pid"])


HOLD_A_SESSION = """
import logging, sys, time
logging.basicConfig(level=logging.INFO)
from streamdi.settings import load_settings
from streamdi.spark import get_spark
assert get_spark(load_settings()).range(3).count() == 3
print("connected", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _wait(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def test_an_idle_server_stops_itself_and_a_connected_client_keeps_it(tmp_path: Path):
    """STREAMDI_SPARK_IDLE_TIMEOUT: the watchdog stops the server once no client has been connected for that long,
    never while one is (here a process holds a session for twice the timeout); with STREAMDI_SPARK_REMOTE unset, a
    command uses the running server instead of starting Spark of its own."""
    home = tmp_path / "home"
    idle = {"STREAMDI_SPARK_IDLE_TIMEOUT": "6"}
    started = cli(home, "spark", "start", extra_env={**REMOTE, **idle})
    assert started.returncode == 0, started.stderr
    pid = json.loads((home / "spark-connect" / "server.json").read_text())["pid"]
    env = {**os.environ, "STREAMDI_HOME": str(home), **idle}
    env.pop("STREAMDI_SPARK_REMOTE", None)  # unset: the running server is used
    try:
        client = subprocess.Popen(
            [sys.executable, "-c", HOLD_A_SESSION, "18"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        line = client.stdout.readline().decode()
        assert line.strip() == "connected", client.stderr.read().decode()
        time.sleep(14)  # more than the idle timeout plus the watchdog's period, with the client connected
        assert _running(pid), "the server stopped under a connected client"
        assert client.wait(60) == 0, client.stderr.read().decode()
        assert "Spark: the Spark Connect server at sc://127.0.0.1:" in client.stderr.read().decode()
        assert _wait(lambda: not _running(pid), 40), "the idle server did not stop"
        assert not (home / "spark-connect" / "server.json").exists()
        # with no server running, an unset STREAMDI_SPARK_REMOTE starts none: the command runs Spark itself
        ran = cli(home, "-v", "doctor", extra_env={"STREAMDI_SPARK_REMOTE": ""})
        assert "Spark: in this process" in ran.stderr, ran.stdout + ran.stderr
        assert not (home / "spark-connect" / "server.json").exists()
    finally:
        cli(home, "spark", "stop", extra_env=REMOTE, timeout=120)
        if not os.environ.get("DATABASE_URL"):
            cli(home, "db", "stop", timeout=120)
