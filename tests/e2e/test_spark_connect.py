"""STREAMDI_SPARK_REMOTE=embedded: `streamdi load` processes run their Spark work on this home's embedded Spark
Connect server, which the first one starts and later ones reuse, and build the same warehouse as Spark in the
process does (every Delta table, every row: the jobs use only the DataFrame API)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_cli_run import cli, pg_snapshot

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REMOTE = {"STREAMDI_SPARK_REMOTE": "embedded"}


def _running(pid: int) -> bool:
    """Linux: the process exists and is not a zombie."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _warehouse(home: Path) -> dict[str, list[str]]:
    """Every Delta warehouse table's rows (sorted, as text), read with delta-rs."""
    from deltalake import DeltaTable

    root = home / "lake" / "warehouse"
    return {
        t.name: sorted(map(repr, DeltaTable(str(t)).to_pyarrow_table().to_pylist()))
        for t in sorted(root.iterdir())
        if (t / "_delta_log").is_dir()
    }


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
        ran = cli(local, "load", "--data", str(data), "--batch", str(batch))
        assert ran.returncode == 0, ran.stdout + ran.stderr
    first = cli(remote, "load", "--data", str(data), "--batch", "1", extra_env=REMOTE)
    assert first.returncode == 0, first.stdout + first.stderr
    state = json.loads((remote / "spark-connect" / "server.json").read_text())
    assert _running(state["pid"])  # the server outlives the process that started it
    second = cli(remote, "load", "--data", str(data), "--batch", "2", extra_env=REMOTE)
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads((remote / "spark-connect" / "server.json").read_text()) == state  # reused, not restarted
    assert not (local / "spark-connect").exists()

    assert _warehouse(remote) == _warehouse(local)
    assert pg_snapshot(remote) == pg_snapshot(local)

    stopped = cli(remote, "spark", "stop", extra_env=REMOTE)
    assert "stopped" in stopped.stdout
    assert not _running(state["pid"])
