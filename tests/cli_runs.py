"""Running the real CLI in subprocesses and snapshotting a STREAMDI_HOME (Delta warehouse and PostgreSQL), for the
e2e tests that compare a run with a reference run (`tests/e2e/conftest.py` holds the shared reference)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from deltalake import DeltaTable

from schemas.warehouse import WAREHOUSE_TABLES
from streamdi import embedded_pg
from streamdi.lake import Lake
from streamdi.settings import Settings
from streamdi.warehouse import open_warehouse

STREAMDI = str(Path(sys.executable).with_name("streamdi"))


def env_for(
    home: Path,
    fault: str | None = None,
    compact: str | None = None,
    remote: str = "off",
    master: str = "local[2]",
    beside: bool = True,
    executors: bool = False,
) -> dict[str, str]:
    """`beside`: the migration runs beside the transform (`STREAMDI_MIGRATE_BESIDE_TRANSFORM`, the default) or
    after it; `executors`: Spark's executors parse every staged source their checks allow, in pieces of 64 KiB
    (`STREAMDI_EXECUTOR_PARSE_BYTES=0`), as on a cluster."""
    drop = ("STREAMDI_FAULT_AT", "DATABASE_URL", "STREAMDI_COMPACT_SMALL_FILES")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(STREAMDI_HOME=str(home), STREAMDI_SPARK_MASTER=master, STREAMDI_SPARK_SHUFFLE_PARTITIONS="2")
    env["STREAMDI_MIGRATE_BESIDE_TRANSFORM"] = str(beside).lower()
    env["STREAMDI_SPARK_REMOTE"] = remote
    if fault:
        env["STREAMDI_FAULT_AT"] = fault
    if compact:
        env["STREAMDI_COMPACT_SMALL_FILES"] = compact
    if executors:
        env.update(STREAMDI_EXECUTOR_PARSE_BYTES="0", STREAMDI_EXECUTOR_PARSE_CHUNK_BYTES=str(64 << 10))
    return env


def load(
    home: Path,
    data: Path,
    batch: int,
    fault: str | None = None,
    compact: str | None = None,
    remote: str = "off",
    master: str = "local[2]",
    beside: bool = True,
    executors: bool = False,
) -> int:
    done = subprocess.run(
        [STREAMDI, "load", "--data", str(data), "--batch", str(batch)],
        env=env_for(home, fault, compact, remote, master, beside, executors),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode not in (0, -9):
        raise AssertionError(f"load failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.returncode


def streamdi_commits(lake_root: Path) -> int:
    """Commits made through streamdi's lake (they carry an app transaction) in every Delta table."""
    total = 0
    for log_dir in lake_root.glob("*/*/_delta_log"):
        total += sum(1 for entry in DeltaTable(str(log_dir.parent)).history() if entry.get("streamdi.app_id"))
    return total


def compacted_layers(lake_root: Path) -> set[str]:
    """The layers with a table that was compacted (an OPTIMIZE commit in its history)."""
    return {
        log_dir.parent.parent.name
        for log_dir in lake_root.glob("*/*/_delta_log")
        if any(entry.get("operation") == "OPTIMIZE" for entry in DeltaTable(str(log_dir.parent)).history())
    }


def snapshot(home: Path) -> dict:
    lake = Lake(home / "lake")
    delta = {t.name: lake.read_arrow(t).to_pylist() for t in WAREHOUSE_TABLES if lake.exists(t)}
    queries = " UNION ALL ".join(
        f"SELECT '{t.name}', count(*), md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM dw.{t.name} x"
        for t in WAREHOUSE_TABLES
    )
    settings = Settings(home=home)
    try:
        _, rows = open_warehouse(settings).query(queries)
    finally:
        embedded_pg.stop_server(settings)
    # a UNION ALL has no row order (PostgreSQL may run it in parallel)
    return {"delta": delta, "postgres": sorted(rows)}


def locked_tables(warehouse) -> set[str]:
    """`dw` tables another session holds a write lock on: an INSERT or COPY of a transaction not yet committed (a
    migration beside the transform lands its tables that way before its COMMIT)."""
    _, rows = warehouse.query(
        """SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'dw' AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()""",
        role="admin",
    )
    return {name for (name,) in rows}


def copy_home(source: Path, target: Path) -> None:
    """Copy a STREAMDI_HOME keeping file owners (the embedded server's data directory belongs to its own user
    when tests run as root), once the stop of its embedded server that the last process asked for is over (that
    process does not wait for it; seen: `cp` missing postmaster.pid as the server removed it)."""
    if (source / "pgdata").exists():
        embedded_pg.server_running(Settings(home=source))  # waits for a stop under way
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)


def driver_jvms(pid: int) -> list[psutil.Process]:
    """The driver JVMs that process `pid` started and that still run (PySpark's `spark-submit ... pyspark-shell`, not
    a `java -version` probe)."""
    return [p for p in psutil.Process(pid).children(recursive=True) if _is_driver_jvm(p)]


def kill_driver_jvm(pid: int, timeout: float = 300) -> None:
    """SIGKILL the driver JVM that process `pid` started (`driver_jvms`), as the kernel's out-of-memory killer would,
    and wait until it has exited (a zombie until its parent reaps it)."""
    deadline = time.monotonic() + timeout
    while not (jvms := driver_jvms(pid)):
        assert time.monotonic() < deadline, f"process {pid} started no driver JVM"
        time.sleep(0.1)
    assert len(jvms) == 1, jvms
    jvms[0].kill()
    while _is_driver_jvm(jvms[0]) and jvms[0].status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)


def _is_driver_jvm(process: psutil.Process) -> bool:
    try:
        return process.name() == "java" and "org.apache.spark.deploy.SparkSubmit" in process.cmdline()
    except (psutil.Error, OSError):  # gone, or a zombie whose command line cannot be read
        return False


def wait_paused(marker: Path, process: subprocess.Popen, timeout: float = 300, output=None) -> None:
    """Until `process` waits at its fault point (`STREAMDI_FAULT_PAUSE` created `marker`); fails with its output
    (`output()`, by default what it wrote to its pipes) if it ends first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, (output or process.communicate)()
        time.sleep(0.1)


def load_paused_at(home: Path, data: Path, batch: int, fault: str, while_paused, **env_options) -> tuple[int, str]:
    """`streamdi load` of `batch` paused at the fault point `fault` (`STREAMDI_FAULT_PAUSE`): `while_paused(pid)` runs
    while it waits there, then it goes on; returns its exit code and its stderr. `env_options` go to `env_for`."""
    paused = home.parent / f"{home.name}.paused"
    env = {**env_for(home, fault=fault, **env_options), "STREAMDI_FAULT_PAUSE": str(paused)}
    loading = subprocess.Popen(
        [STREAMDI, "load", "--data", str(data), "--batch", str(batch)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_paused(paused, loading)
        while_paused(loading.pid)
        paused.unlink()
        _, stderr = loading.communicate(timeout=300)
    finally:
        if loading.poll() is None:
            loading.kill()
        paused.unlink(missing_ok=True)
    return loading.returncode, stderr.decode()
