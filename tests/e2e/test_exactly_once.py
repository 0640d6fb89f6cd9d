"""Exactly-once under crashes: `streamdi load` is killed (SIGKILL) right after a random Delta commit (or a named
commit of the later steps), rerun, and must end identical to a run that never crashed -- Delta warehouse row for
row, PostgreSQL tables and no duplicate versions.

Each seed loads Batch1 and Batch2 of a small generated data set in subprocesses (the real CLI); the crash
point is the N-th commit of a load (`STREAMDI_FAULT_AT=lake.after_commit#N`), N drawn by the seed among the
commits the uncrashed run makes in that batch, so crashes land between step commits of stage, transform and
the batch log alike.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from builders import at_scale
from cli_runs import compacted_layers, copy_home, load, snapshot

from streamdi.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.slow]

# (seed, batch crashed): the incremental once; with STREAMDI_TEST_SCALE=full also Batch1 once and the incremental
# again (a Batch1 crash costs minutes; its commits are also crashed by tests/e2e/test_cli_run.py and test_lake)
CASES = ((2, 2), *at_scale((), ((1, 1), (3, 2))))


@pytest.mark.parametrize(("seed", "batch"), CASES)
def test_crash_after_a_random_commit_then_rerun_equals_the_uncrashed_run(seed, batch, data, reference, tmp_path):
    """The crash point is drawn among the commits the uncrashed run makes in `batch`; a crash in Batch2 starts
    from a copy of the uncrashed run's state after Batch1 (the state a real run has there)."""
    expected, commits, after_batch1 = reference
    nth = random.Random(seed).randint(1, commits[batch - 1])
    home = tmp_path / "home"
    if batch == 2:
        copy_home(after_batch1, home)
    # the crashed run and its rerun compact every table with 2 small files (the reference never compacts): the
    # compaction commits sit between the batches' commits, in the change feeds that migration reads
    assert load(home, data, batch, fault=f"lake.after_commit#{nth}", compact="2") == -9
    assert load(home, data, batch, compact="2") == 0  # the rerun finishes the batch
    if batch == 1:
        assert load(home, data, 2, compact="2") == 0
    assert {"staging", "warehouse"} <= compacted_layers(home / "lake")
    got = snapshot(home)
    assert got["postgres"] == expected["postgres"]
    for table, rows in expected["delta"].items():
        assert got["delta"][table] == rows, f"{table} differs after crash and rerun (seed {seed})"


# Commits of the warehouse's later steps, crashed right after in Batch2: the step's other commits (its alerts, the
# market slices, the tables after it in the step) are missing when the rerun starts.
NAMED = ("T3/factholdings", "T4/factmarkethistory", "AG/trade_windows", "AG/trade_window_slices") + at_scale(
    (),
    (
        "T2/prospect",
        "T3/factcashbalances",
        "T4/market_slices",
        "T4/factwatches",
        "AG/market_windows",
        "AG/window_latest",
    ),
)


@pytest.mark.parametrize("commit", NAMED)
def test_crash_right_after_a_named_commit_of_batch2_then_rerun_equals_the_uncrashed_run(
    commit, data, reference, tmp_path
):
    expected, _, after_batch1 = reference
    home = tmp_path / "home"
    copy_home(after_batch1, home)
    assert load(home, data, 2, fault=f"lake.after_commit:{commit}") == -9
    assert load(home, data, 2) == 0
    got = snapshot(home)
    assert got["postgres"] == expected["postgres"]
    for table, rows in expected["delta"].items():
        assert got["delta"][table] == rows, f"{table} differs after a crash after {commit} and a rerun"


def test_crash_between_the_executors_write_and_the_drivers_commit_then_rerun_equals_the_uncrashed_run(
    data, reference, tmp_path
):
    """Batch1 with the staged sources parsed and written by Spark's executors (`executors`): killed after the
    executors wrote Trade's staged pieces and the driver moved them into the table, before its commit. The rerun
    writes them again under the same names and commits them once; the warehouse equals the reference, whose driver
    parsed and wrote everything itself."""
    expected, _, _ = reference
    home = tmp_path / "home"
    commit = "stage/trade"
    assert load(home, data, 1, fault=f"lake.before_commit:{commit}", executors=True) == -9
    assert list((home / "lake").glob("staging/trade/stage-trade-v*-*.snappy.parquet"))  # moved in, not committed
    assert load(home, data, 1, executors=True) == 0
    assert load(home, data, 2, executors=True) == 0
    got = snapshot(home)
    assert got["postgres"] == expected["postgres"]
    for table, rows in expected["delta"].items():
        assert got["delta"][table] == rows, f"{table} differs after a crash before {commit}'s executor-written commit"


def test_tables_landed_beside_the_transform_stay_invisible_and_a_crash_rolls_them_back(data, reference, tmp_path):
    """Batch2's migration runs beside its transform: paused right after AG's window_latest commit (AG's last), its
    open transaction has landed the tables of T0-T4 (it holds their write locks) while a reader still sees Batch1 only
    and the ledger has nothing of Batch2. A SIGKILL there leaves PostgreSQL at Batch1; the rerun ends where the
    reference (which migrates after the transform) ended."""
    import subprocess
    import time

    from cli_runs import STREAMDI, env_for, locked_tables, wait_paused

    from streamdi.warehouse import open_warehouse

    expected, _, after_batch1 = reference
    home = tmp_path / "home"
    copy_home(after_batch1, home)
    paused = tmp_path / "paused"
    env = {**env_for(home, fault="lake.after_commit:AG/window_latest"), "STREAMDI_FAULT_PAUSE": str(paused)}
    loading = subprocess.Popen(
        [STREAMDI, "load", "--data", str(data), "--batch", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    settings = Settings(home=home)
    try:
        wait_paused(paused, loading)
        deadline = time.monotonic() + 300
        warehouse = open_warehouse(settings)
        landed = {"dimcustomer", "dimaccount", "dimtrade", "factholdings", "factmarkethistory"}
        locked: set[str] = set()
        while not landed <= locked:  # the migration lands them while AG's commit is held at the fault point
            assert time.monotonic() < deadline, locked
            locked = locked_tables(warehouse)
            time.sleep(0.1)
        assert warehouse.last_visible_batch() == 1
        assert warehouse.query("SELECT count(*) FROM streamdi.migration_ledger WHERE batch_id = 2")[1] == [(0,)]
        loading.kill()
        loading.communicate(timeout=60)
        assert warehouse.last_visible_batch() == 1
        assert warehouse.query("SELECT count(*) FROM streamdi.migration_ledger WHERE batch_id = 2")[1] == [(0,)]
    finally:
        if loading.poll() is None:
            loading.kill()
        paused.unlink(missing_ok=True)
    assert load(home, data, 2) == 0
    assert snapshot(home) == expected
    # every commit to a table a step declares final comes from that step (`Step.final`), in both batches
    from jobs.transform import STEPS
    from streamdi.lake import Lake

    lake = Lake(home / "lake")
    for step in STEPS:
        for table in step.final:
            writers = {c.app_id.split("/")[0] for c in lake.history(table) if c.app_id}
            assert writers <= {step.name}, (table.name, writers)


def test_a_driver_jvm_killed_under_load_is_named_and_the_rerun_equals_the_uncrashed_run(data, reference, tmp_path):
    """`streamdi load` of Batch1, its staged sources parsed by Spark's executors (`executors`), with its driver JVM
    killed with SIGKILL (as the kernel's out-of-memory killer does) in the middle of the stage (paused right after
    CashTransaction's staging commit, a Batch1 source, with the larger ones still to parse): the command fails and says,
    after the traceback, that the JVM was killed and that a rerun does not redo finished steps; the reruns of Batch1
    and Batch2 end where the uncrashed run ended."""
    from cli_runs import kill_driver_jvm, load_paused_at

    expected, _, _ = reference
    home = tmp_path / "home"
    fault = "lake.after_commit:stage/cashtransaction"
    code, stderr = load_paused_at(home, data, 1, fault, kill_driver_jvm, executors=True)
    assert code == 1
    said = " ".join(stderr.split())  # the message as one line, whatever the terminal width
    assert "The Spark driver JVM exited during the run: killed by SIGKILL" in said, stderr[-3000:]
    assert "the steps that finished are not redone" in said
    assert load(home, data, 1) == 0
    assert load(home, data, 2) == 0
    assert snapshot(home) == expected


def test_a_load_stops_its_spark_once_its_stage_is_done_and_ends_where_the_reference_ended(data, reference, tmp_path):
    """`streamdi load` of Batch1 with its staged sources parsed by Spark's executors (`executors`): the transform and
    the migration run on Arrow, so once the stage is over the process stops its driver JVM (and its Python workers)
    rather than holding them to its end; paused in the transform, the process has no JVM left. Batch1 then Batch2
    (a new process, which starts a JVM of its own) end where the reference run ended."""
    from cli_runs import driver_jvms, load_paused_at

    expected, _, _ = reference
    home = tmp_path / "home"

    def no_jvm_left(pid: int) -> None:
        deadline = time.monotonic() + 60
        while driver_jvms(pid):
            assert time.monotonic() < deadline, "the driver JVM still runs in the transform"
            time.sleep(0.2)

    code, stderr = load_paused_at(home, data, 1, "lake.before_commit:T2/dimaccount", no_jvm_left, executors=True)
    assert code == 0, stderr[-3000:]
    assert list((home / "lake" / "staging" / "trade").glob("stage-trade-v1-*.snappy.parquet"))  # the executors
    assert load(home, data, 2, executors=True) == 0
    assert snapshot(home) == expected


def test_crash_of_a_spark_connect_client_then_rerun_equals_the_uncrashed_run(data, reference, tmp_path):
    """STREAMDI_SPARK_REMOTE=embedded (Airflow tasks' default), with the staged sources parsed and written by the
    executors (`executors`: the server's Python workers run streamdi's parse): the client process is killed
    right after T1's DimSecurity commit in Batch1, while T2 runs beside it; the server outlives it, the rerun reuses
    it, and after Batch2 (whose bag sources the server's executors parse too) the home ends where the uncrashed run
    (Spark in the process, everything parsed and written in the driver) ended."""
    import json

    from streamdi import spark_connect

    expected, _, _ = reference
    home = tmp_path / "home"
    settings = Settings(home=home)
    try:
        assert load(home, data, 1, fault="lake.after_commit:T1/dimsecurity", remote="embedded", executors=True) == -9
        server = json.loads((home / "spark-connect" / "server.json").read_text())
        assert spark_connect.running(server["pid"])  # the crash of a client leaves its server running
        assert load(home, data, 1, remote="embedded", executors=True) == 0
        assert json.loads((home / "spark-connect" / "server.json").read_text()) == server  # reused, not restarted
        assert load(home, data, 2, remote="embedded", executors=True) == 0
        assert list((home / "lake" / "staging" / "trade").glob("stage-trade-v1-*.snappy.parquet"))  # the executors
    finally:
        spark_connect.stop_server(settings)
    got = snapshot(home)
    assert got["postgres"] == expected["postgres"]
    for table, rows in expected["delta"].items():
        assert got["delta"][table] == rows, f"{table} differs after a Spark Connect client's crash and a rerun"


def test_maintenance_between_micro_batches_leaves_the_warehouse_of_a_run_without_it(data, reference, tmp_path):
    """Batch2 dripped as 3 micro-batches after the reference's Batch1; every table is checkpointed and vacuumed
    (retention 0) and loses its log before the previous checkpoint whenever a micro-batch ends with nothing pending,
    and compacted every 2 small files: the next micro-batch still reads what it needs (change feeds, snapshots,
    history), the migration still finds its versions,
    and the end state equals the reference run (Batch2 whole, never maintained)."""
    import os
    import subprocess

    from cli_runs import STREAMDI, env_for
    from deltalake import DeltaTable

    expected, _, after_batch1 = reference
    home = tmp_path / "home"
    copy_home(after_batch1, home)
    env = {**env_for(home, compact="2"), "STREAMDI_CHECKPOINT_EVERY": "1", "STREAMDI_VACUUM_RETENTION_HOURS": "0"}
    done = subprocess.run(
        [STREAMDI, "load", "--data", str(data), "--batch", "2", "--drip", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("drip ") == 3, done.stdout
    assert snapshot(home) == expected
    tables = sorted((home / "lake").glob("*/*/_delta_log"))
    assert len(tables) > 20
    # the log cleanup took the commits before each table's previous checkpoint (the first one, at least)
    assert any(not (log_dir / "00000000000000000000.json").exists() for log_dir in tables)
    for log_dir in tables:
        assert (log_dir / "_last_checkpoint").is_file(), log_dir
        on_disk = {
            str(p.relative_to(log_dir.parent)) for p in log_dir.parent.rglob("*.parquet") if "_delta_log" not in p.parts
        }
        live = set(DeltaTable(str(log_dir.parent)).file_uris())
        live = {os.path.relpath(uri.removeprefix("file://"), log_dir.parent) for uri in live}
        # the change files of the commits still in the log, and no others (delta-rs's vacuum leaves them)
        named = set()
        for commit in log_dir.glob("*.json"):
            named |= {line for line in commit.read_text().splitlines() if line.startswith('{"cdc"')}
        named = {json.loads(line)["cdc"]["path"] for line in named}
        assert on_disk == live | named, log_dir  # vacuumed
