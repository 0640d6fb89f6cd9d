"""One runner per lake (`streamdi.locks.lake_lease`): a second runner is refused with the holder's name, the tasks
of one Airflow DAG run share the lease, a holder killed with SIGKILL frees it at once, and the CLI and the Airflow
job functions take it (a test process holds the lease while the real command runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from cli_runs import STREAMDI, env_for

from streamdi.locks import LOCK_DIR, LakeBusy, lake_lease, lease_holders

HOLDER = """
import sys, time
from streamdi.locks import lake_lease
with lake_lease(sys.argv[1], "streamdi stream (test holder)"):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture(autouse=True)
def outside_airflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Airflow task context: `dag.test()` runs earlier in the session leave AIRFLOW_CTX_* in the environment, and
    processes with the same DAG run there would share the lease (the tests below set it where they mean it)."""
    for name in [n for n in os.environ if n.startswith("AIRFLOW_CTX_")]:
        monkeypatch.delenv(name)


@contextmanager
def holder(root: Path, env: dict[str, str] | None = None):
    """A separate process that holds the lease of `root` until the block ends (then it is killed)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()


def airflow_env(run_id: str) -> dict[str, str]:
    return {"AIRFLOW_CTX_DAG_ID": "streamdi_incremental", "AIRFLOW_CTX_DAG_RUN_ID": run_id, "AIRFLOW_CTX_TASK_ID": "t"}


def test_a_second_runner_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with holder(tmp_path) as process:
        with pytest.raises(LakeBusy) as refused, lake_lease(tmp_path, "streamdi load"):
            pytest.fail("the lease was given to a second runner")
        message = str(refused.value)
        holder_named = f"the lake {tmp_path.absolute()} is in use by streamdi stream (test holder) (pid {process.pid},"
        assert holder_named in message
        assert "refused (streamdi load)" in message
        assert [h["pid"] for h in lease_holders(tmp_path)] == [process.pid]
    assert lease_holders(tmp_path) == []  # the killed holder does not count


def test_a_holder_killed_with_sigkill_frees_the_lease_at_once(tmp_path: Path) -> None:
    with holder(tmp_path) as process:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        with lake_lease(tmp_path, "the restart"):
            (mine,) = lease_holders(tmp_path)
            assert mine["pid"] == os.getpid() and mine["runner"] == "the restart"
    assert json.loads((tmp_path / LOCK_DIR / "lease.json").read_text()) == []


def test_a_reused_pid_is_not_the_holder(tmp_path: Path) -> None:
    """An entry whose pid now belongs to another process (its start time differs) does not hold the lease."""
    (tmp_path / LOCK_DIR).mkdir()
    me = psutil.Process()
    stale = {"pid": me.pid, "started": me.create_time() - 1000, "group": "process 1", "runner": "x", "since": "-"}
    (tmp_path / LOCK_DIR / "lease.json").write_text(json.dumps([stale]))
    with lake_lease(tmp_path, "me"):
        assert [h["runner"] for h in lease_holders(tmp_path)] == ["me"]


def test_the_tasks_of_one_airflow_dag_run_share_the_lease_and_no_one_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with holder(tmp_path, airflow_env("run-1")):
        for name, value in airflow_env("run-1").items():
            monkeypatch.setenv(name, value)
        with lake_lease(tmp_path):  # T1 beside T2 of the same run
            assert len(lease_holders(tmp_path)) == 2
        monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "run-2")
        holder_run = "in use by streamdi stream .*Airflow DAG run streamdi_incremental / run-1"
        other_run = pytest.raises(LakeBusy, match=holder_run)
        with other_run, lake_lease(tmp_path):
            pass


def test_the_lease_is_reentrant_in_a_process(tmp_path: Path) -> None:
    with lake_lease(tmp_path, "outer"):
        with lake_lease(tmp_path, "inner"):
            assert [h["runner"] for h in lease_holders(tmp_path)] == ["outer"]
        assert len(lease_holders(tmp_path)) == 1
    assert lease_holders(tmp_path) == []


def test_the_cli_refuses_to_run_beside_another_runner(tmp_path: Path) -> None:
    """`streamdi run` and `streamdi batch skip` while the stream service (here: a process holding the lease) works
    on the same lake: exit 2, one line naming the holder, no traceback, nothing registered."""
    home = tmp_path / "home"
    landing = home / "landing"
    landing.mkdir(parents=True)
    (landing / "BatchDate.txt").write_text("2017-07-08\n")
    lake = home / "lake"
    env = env_for(home)
    with holder(lake) as process:
        started = time.monotonic()
        for command in (["run"], ["batch", "skip", "1", "--reason", "test"]):
            done = subprocess.run([STREAMDI, *command], env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 2, done.stderr
            assert f"is in use by streamdi stream (test holder) (pid {process.pid}," in done.stderr
            assert "Traceback" not in done.stderr
        assert time.monotonic() - started < 120  # refused at once: no Spark, no PostgreSQL
    assert not any((lake / "platform").glob("*/_delta_log")), "the refused run registered files"


def test_the_airflow_jobs_take_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Airflow job functions that advance the batch log are refused while another runner holds the lake; a
    migrate-only call (here with nothing to migrate) is not refused: migrations serialise in PostgreSQL and may run
    beside a loading pipeline."""
    from streamdi.run import orchestration
    from streamdi.settings import Settings

    settings = Settings(home=tmp_path, spark_remote="off")
    settings.landing_dir.mkdir(parents=True)
    (settings.landing_dir / "BatchDate.txt").write_text("2017-07-08\n")
    with holder(settings.lake_root), pytest.raises(LakeBusy):
        orchestration.collect_landed(settings)
    assert orchestration.collect_landed(settings)["batch_ids"] == [1]
    with holder(settings.lake_root):
        with pytest.raises(LakeBusy):
            orchestration.process_batches(None, "stage", "push", settings)
        with pytest.raises(LakeBusy):
            orchestration.transform_step(1, "T0", "push", settings)
        assert orchestration.migrate_transformed(settings) == {"steps": []}
