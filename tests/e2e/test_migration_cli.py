"""Push and pull through the real CLI: `streamdi query [--fresh]` (pull mode sees the batch committed a moment
before the query; without --fresh it does not), the named query `trade_summary` against figures computed here,
and the `streamdi migrate --every` loop, which keeps batches flowing and stops cleanly on SIGTERM.

Lakes are hand-built with `Lake` (no Spark); each test migrates into a database of its own on the test server.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_migration_pending import (  # noqa: E402
    T0,
    StreamLake,
    TradeModel,
    completed,
    database_settings,
    first_batches,
    trade_row,
)

from schemas.warehouse import WAREHOUSE_TABLES  # noqa: E402
from streamdi.migrator import migrate_pending  # noqa: E402
from streamdi.queries import NAMED_QUERIES  # noqa: E402
from streamdi.warehouse import open_warehouse  # noqa: E402

pytestmark = pytest.mark.e2e


def cli_env(home: Path, database_url: str, lake: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMDI_FAULT_AT"}
    env.update(
        STREAMDI_HOME=str(home),
        STREAMDI_LAKE=str(lake),
        DATABASE_URL=database_url,
        COLUMNS="200",
        PYTHONUNBUFFERED="1",
    )
    return env


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "streamdi.run.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def table_rows(stdout: str) -> list[list[str]]:
    """The body rows of the rich table the CLI printed."""
    return [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in stdout.splitlines()
        if line.startswith("│") and line.count("│") >= 2
    ]


def expected_summary(model: TradeModel) -> list[tuple]:
    """trade_summary computed from the test's own rows: per type, trades, total and average quantity, total and
    average (trade price - bid price) over the trades that have a trade price."""
    by_type: dict[str, list[dict]] = {}
    for row in model.rows.values():
        by_type.setdefault(row["type"], []).append(row)
    out = []
    for name, rows in sorted(by_type.items()):
        quantities = [r["quantity"] for r in rows]
        diffs = [r["tradeprice"] - r["bidprice"] for r in rows if r["tradeprice"] is not None]
        out.append(
            (
                name,
                len(rows),
                sum(quantities),
                (Decimal(sum(quantities)) / len(quantities)).quantize(Decimal("0.0001")),
                sum(diffs) if diffs else None,
                (sum(diffs) / len(diffs)).quantize(Decimal("0.0001")) if diffs else None,
            )
        )
    return out


def two_batches_pushed(settings, warehouse, tmp_path, database: str):
    """A lake with the first two batches, pushed into `database` of its own: (stream, CLI env, warehouse, pushed)."""
    db = database_settings(settings, warehouse, database)
    stream = StreamLake(tmp_path / "lake")
    first_batches(stream)
    env = cli_env(settings.home, db.database_url, stream.lake.root)
    target = open_warehouse(db)
    target.ensure_objects(WAREHOUSE_TABLES)
    return stream, env, target, migrate_pending(stream.lake, target, mode="push")


def test_query_fresh_sees_the_batch_committed_a_moment_before(settings, warehouse, tmp_path):
    stream, env, target, pushed = two_batches_pushed(settings, warehouse, tmp_path, "mig_cli_pull")
    assert pushed.batches == (1, 2)
    before = expected_summary(stream.model)
    assert target.read_snapshot(NAMED_QUERIES["trade_summary"].sql).rows == before

    stream.batch(
        arrived_at=dt.datetime.now(dt.UTC),
        trades=[completed(trade_row(500 + i, type="Limit Sell", quantity=10 * i), Decimal("25.05")) for i in (1, 2)],
    )
    stale = cli("query", "trade_summary", env=env)
    fresh = cli("query", "--fresh", "trade_summary", env=env)

    after = expected_summary(stream.model)
    assert [r[0] for r in after] == ["Limit Sell", "Market Buy"] and [r[0] for r in before] == ["Market Buy"]
    as_text = [[str(v) if v is not None else "NULL" for v in row] for row in after]
    assert table_rows(stale.stdout) == as_text[1:]  # not pulled: batch 3 is not there
    assert "staleness: " in stale.stdout and "newest visible batch 2" in stale.stdout
    assert table_rows(fresh.stdout) == as_text
    assert "pulled: batch 3 visible in" in fresh.stdout and "newest visible batch 3" in fresh.stdout
    assert target.read_snapshot(NAMED_QUERIES["trade_summary"].sql).rows == after
    assert stream.log.is_done(3, "migrate")  # the dataflow's migrate stage for it is done
    again = cli("query", "--fresh", "SELECT count(*) AS trades FROM dw.dimtrade", env=env)
    assert table_rows(again.stdout) == [[str(len(stream.model.rows))]]
    assert "pulled: nothing pending" in again.stdout


def test_a_query_is_one_read_only_statement_under_a_time_limit_and_a_failure_is_one_line(settings, warehouse, tmp_path):
    """`streamdi query` cannot write: a second statement after the first (even after a COMMIT) is refused, a write
    fails; a statement past STREAMDI_QUERY_TIMEOUT is cancelled; every failure is one line on stderr and exit 1."""
    _, env, target, _ = two_batches_pushed(settings, warehouse, tmp_path, "mig_cli_guard")
    trades = target.query("SELECT count(*) FROM dw.dimtrade", role="admin")[1]
    assert trades[0][0] > 0
    several = "cannot insert multiple commands into a prepared statement"
    for statement, error, extra in (
        ("SELECT 1; DELETE FROM dw.dimtrade", several, {}),
        ("COMMIT; DELETE FROM dw.dimtrade", several, {}),
        ("DELETE FROM dw.dimtrade", "cannot execute DELETE in a read-only transaction", {}),
        ("SELECT * FROM dw.nothing_here", 'relation "dw.nothing_here" does not exist', {}),
        ("SELECT pg_sleep(30)", "canceling statement due to statement timeout", {"STREAMDI_QUERY_TIMEOUT": "0.5"}),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "streamdi.run.cli", "query", statement],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        failed = [line for line in done.stderr.splitlines() if line.startswith("query failed: ")]
        assert len(failed) == 1 and error in failed[0], done.stderr
        assert "Traceback" not in done.stdout + done.stderr
    assert target.query("SELECT count(*) FROM dw.dimtrade", role="admin")[1] == trades


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


NOTHING_PENDING = "nothing pending: every batch committed in Delta is visible in PostgreSQL"


def _batch_3_line(lines: list[str]) -> int:
    """Index of the round that made batch 3 visible (len(lines) while there is none yet)."""
    return next((i for i, line in enumerate(lines) if ": batch 3 visible in" in line), len(lines))


def test_migrate_every_pushes_new_batches_until_sigterm(settings, warehouse, tmp_path):
    db = database_settings(settings, warehouse, "mig_cli_loop")
    stream = StreamLake(tmp_path / "lake")
    first_batches(stream)
    target = open_warehouse(db)
    loop = subprocess.Popen(
        [sys.executable, "-m", "streamdi.run.cli", "migrate", "--every", "0.2"],
        env=cli_env(settings.home, db.database_url, stream.lake.root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed: list[str] = []

    def read_stdout() -> None:
        for line in loop.stdout:
            printed.append(line.rstrip("\n"))

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        wait_until(lambda: target.query("SELECT to_regclass('streamdi.batch_metrics') IS NOT NULL")[1][0][0])
        wait_until(lambda: target.last_visible_batch() == 2)
        stream.batch(arrived_at=T0 + dt.timedelta(minutes=5), trades=[trade_row(77, batchid=3)])
        wait_until(lambda: target.last_visible_batch() == 3)
        assert (77,) in target.query("SELECT tradeid FROM dw.dimtrade WHERE tradeid = 77")[1]
        # each round's line reaches the pipe as it is printed: wait for a round after batch 3 that finds nothing
        wait_until(lambda: any(NOTHING_PENDING in line for line in printed[_batch_3_line(printed) :]))
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=60)
        reader.join(timeout=10)
        stderr = loop.stderr.read()
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.communicate()
    assert loop.returncode == 0, stderr
    lines = list(printed)
    assert lines[0].startswith("round 1: batches 1-2 visible in")
    assert any(line.startswith("round ") and ": batch 3 visible in" in line for line in lines)
    assert any(line.endswith(NOTHING_PENDING) for line in lines[_batch_3_line(lines) :])
    rounds = int(lines[-1].split()[2])
    assert lines[-1] == f"stopped after {rounds} round(s)" and len(lines) == rounds + 1
    assert [b for b, *_ in target.query("SELECT batch_id, mode FROM streamdi.batch_metrics ORDER BY 1")[1]] == [1, 2, 3]
    assert all(stream.log.is_done(b, "migrate") for b in (1, 2, 3))
