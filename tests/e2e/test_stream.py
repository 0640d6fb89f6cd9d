"""The stream service (`streamdi stream`) as a real process on a landing zone fed by the drip generator.

Every test starts from the reference run's home after Batch1 (`conftest.reference`), feeds Batch2 into the service's
landing zone while it runs, and compares the final Delta warehouse and PostgreSQL tables with the reference run that
loaded Batch2 whole with `streamdi load`: the expected warehouse comes from that other path, never from the service.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_runs import STREAMDI, copy_home, env_for, kill_driver_jvm, snapshot, wait_paused
from windows_oracle import answered_rows, expected_windows, named_query_rows, stored_windows

from streamdi import embedded_pg
from streamdi.batchlog import BatchLog
from streamdi.delivery import deliver_batch, root_audits
from streamdi.generator.drip import DripOptions, drip, plan
from streamdi.lake import Lake
from streamdi.parts import part_of
from streamdi.queries import NAMED_QUERIES
from streamdi.settings import Settings
from streamdi.warehouse import open_warehouse

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


LOGS: dict[int, Path] = {}  # service pid -> its output


def start_stream(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    path = home.parent / f"stream-{time.monotonic_ns()}.log"
    with open(path, "w") as log:
        process = subprocess.Popen(
            [STREAMDI, "-v", "stream", "--interval", "0.2", *args],
            env={**env_for(home), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    LOGS[process.pid] = path
    return process


def wait_running(home: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until `process` holds the home (the status file is its own)."""
    deadline = time.monotonic() + timeout
    status = home / "stream" / "status.json"
    while not (status.exists() and json.loads(status.read_text() or "{}").get("pid") == process.pid):
        assert time.monotonic() < deadline, "the stream service did not start"
        assert process.poll() is None, output(process)
        time.sleep(0.1)


def half_done(home: Path) -> set[int]:
    """Micro-batches with some stages done and others not."""
    states = BatchLog(Lake(home / "lake")).states()
    batches = {b for b, _ in states}
    done = {b: [states.get((b, s)) == "done" for s in ("stage", "transform", "migrate")] for b in batches}
    return {b for b, flags in done.items() if any(flags) and not all(flags)}


def feed(data: Path, home: Path, options: DripOptions, rate: float) -> list:
    """Drip Batch2 into the landing zone, then deliver its audit files as `streamdi load --drip` does."""
    deliveries = drip(data / "Batch2", home / "landing", options, rate=rate)
    feed_audits(data, home)
    return deliveries


def feed_audits(data: Path, home: Path) -> None:
    for audit in [*sorted((data / "Batch2").glob("*_audit.csv")), *root_audits(data, 2)]:
        target = home / "landing" / "Batch2" / audit.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(audit.read_bytes())


def output(process: subprocess.Popen) -> str:
    return LOGS[process.pid].read_text()


def wait(process: subprocess.Popen, timeout: float = 600) -> int:
    return process.wait(timeout=timeout)


def assert_equals_reference(home: Path, expected: dict) -> None:
    got = snapshot(home)
    assert got["postgres"] == expected["postgres"]
    for table, rows in expected["delta"].items():
        assert got["delta"][table] == rows, f"{table} differs from the whole load"


def stage_details(home: Path) -> list[dict]:
    return [detail for detail in BatchLog(Lake(home / "lake")).done_details("stage").values() if detail]


def test_a_faulty_drip_streamed_ends_like_the_whole_load(data, reference, tmp_path):
    """Batch2 dripped with disorder, late pieces and duplicated pieces while the service runs, cut in rounds: the
    same warehouse as the whole load; each micro-batch is one round of parts, in order, whatever the disorder;
    every duplicate is named in the batch log and not staged; the status shows the latency. With a landing retention
    of 0, each micro-batch's files are deleted once it is visible, while later, late and duplicated parts still
    arrive: nothing reads them again."""
    expected, _, after_batch1 = reference
    home = tmp_path / "home"
    copy_home(after_batch1, home)
    service = start_stream(home, "--idle-exit", "4", "--cut", "round", env={"STREAMDI_LANDING_RETENTION_HOURS": "0"})
    options = DripOptions(parts=8, disorder=0.3, late=0.2, duplicates=0.25, seed=7)
    deliveries = feed(data, home, options, rate=25)
    assert wait(service) == 0, output(service)
    duplicates = {d.file for d in deliveries if d.kind == "duplicate"}
    assert len(duplicates) >= 3 and any(d.late for d in deliveries)
    batch_log = BatchLog(Lake(home / "lake"))
    rounds = []
    for batch_id in batch_log.batch_ids()[1:]:
        parts = [part_of(f.file) for f in batch_log.files(batch_id)]
        numbers = {p.number for p in parts if p is not None}
        assert len(numbers) <= 1 and (not numbers or None not in parts), (batch_id, parts)
        originals = [f.file for f in batch_log.files(batch_id) if "_dup" not in f.file]
        if numbers and originals:  # a duplicate that came after its round was cut makes a micro-batch of its own
            rounds.append(numbers.pop())
    assert rounds == list(range(8)), output(service)
    reported = {name for detail in stage_details(home) for name in (detail.get("duplicates") or {})}
    assert reported == duplicates
    assert_equals_reference(home, expected)
    # the live windows equal a from-scratch computation over the same records, and so do the named queries over
    # them in PostgreSQL
    oracle = expected_windows(home / "lake")
    assert stored_windows(home / "lake") == oracle
    # and so do the windows answered when queried, from the slices in PostgreSQL
    settings = Settings(home=home)
    try:
        warehouse = open_warehouse(settings)
        got = {name: warehouse.query(NAMED_QUERIES[name].sql)[1] for name in ("sector_day", "broker_week")}
        answered = {name: warehouse.query(NAMED_QUERIES[name].sql)[1] for name in ("sector_24h",)}
        for view in ("trade_window_answers", "market_window_answers"):
            answered[view] = warehouse.query(
                f"SELECT * FROM dw.{view} ORDER BY window_name, level, node, window_start"
            )[1]
    finally:
        embedded_pg.stop_server(settings)
    expected_rows = named_query_rows(oracle)
    assert expected_rows["sector_day"] and expected_rows["broker_week"]
    assert {k: [tuple(r) for r in v] for k, v in got.items()} == expected_rows
    expected_answers = answered_rows(expected_windows(home / "lake", stored=False))
    assert expected_answers["trade_window_answers"] and expected_answers["sector_24h"]
    assert {k: sorted(tuple(r) for r in v) for k, v in answered.items()} == {
        k: sorted(v) for k, v in expected_answers.items()
    }

    status = subprocess.run([STREAMDI, "stream", "status"], env=env_for(home), capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert "not running (last state: stopped)" in status.stdout
    assert "latency, arrival -> visible" in status.stdout and "waiting: 0 file(s)" in status.stdout
    assert "MiB resident" in status.stdout and "resident tables' rows" in status.stdout
    registered = [f.file for b in batch_log.batch_ids() for f in batch_log.files(b)]
    assert [f for f in registered if (home / "landing" / f).exists()] == []
    assert json.loads((home / "stream" / "status.json").read_text())["landing_deleted"] == len(registered)
    assert f"landing zone: {len(registered)} file(s) of finished micro-batches deleted" in status.stdout
    memory = json.loads((home / "stream" / "status.json").read_text())["memory"]
    assert memory["resident_mb"] > 100  # a Python process with pyarrow and the lake's handles
    assert memory["arrow_mb"] >= 0 and 0 <= memory["held_tables_mb"] <= 1024  # within the default resident_mb


def test_kill_9_and_sigterm_at_random_moments_then_restart_ends_like_the_whole_load(data, reference, tmp_path):
    """The service is stopped three times while Batch2 drips in: SIGKILL twice at random moments (a restart resumes
    exactly once), SIGTERM once (it finishes the micro-batch in flight: no batch is left half done, and it exits
    0). A second service on the same home is refused while one runs."""
    expected, _, after_batch1 = reference
    home = tmp_path / "home"
    copy_home(after_batch1, home)
    rng = random.Random(11)
    feeder = threading.Thread(target=feed, args=(data, home, DripOptions(parts=10, seed=3), 4.0))
    service = start_stream(home)
    feeder.start()
    wait_running(home, service)
    second = subprocess.run([STREAMDI, "stream"], env=env_for(home), capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and "already runs" in second.stderr

    before = set()
    for stop in (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
        time.sleep(rng.uniform(2.0, 9.0))
        service.send_signal(stop)
        code = wait(service, timeout=300)
        if stop == signal.SIGTERM:  # it finished what it began (a batch a SIGKILL left half done may still be)
            assert code == 0, output(service)
            assert half_done(home) <= before, output(service)
        else:
            assert code == -signal.SIGKILL
        before = half_done(home)
        service = start_stream(home)
    feeder.join()
    wait_running(home, service)  # a SIGTERM before the service handles signals would just kill it
    service.send_signal(signal.SIGTERM)
    assert wait(service) == 0
    final = start_stream(home, "--idle-exit", "2")  # anything that arrived after the last SIGTERM
    assert wait(final) == 0, output(final)
    assert not BatchLog(Lake(home / "lake")).pending()
    assert_equals_reference(home, expected)


def test_a_missing_part_is_held_then_cut_past_its_grace_and_said_in_dimessages(data, reference, tmp_path):
    """Account_batch2_0001.txt is withheld while the rest of Batch2 (4 parts per file) streams in: its successors are
    held back for the grace (1 s), then cut without it; the stage records the failed `predecessor_present` check
    (policy warn), which DImessages reports. The missing part then arrives and is processed: the warehouse equals
    the whole load's except for that one DImessages row."""
    expected, _, after_batch1 = reference
    home = tmp_path / "home"
    copy_home(after_batch1, home)
    env = {"STREAMDI_MISSING_PART_GRACE": "1"}
    deliveries, contents = plan(data / "Batch2", DripOptions(parts=4, seed=3))
    missing = "Account_batch2_0001.txt"
    assert missing in contents and "Account_batch2_0002.txt" in contents
    landing = home / "landing"
    landing.mkdir(parents=True, exist_ok=True)
    service = start_stream(home, "--idle-exit", "3", env=env)
    for d in deliveries:
        if d.file != missing:
            (landing / d.file).write_bytes(contents[d.file])
    assert wait(service) == 0, output(service)
    assert "Account_batch2_0002.txt: its predecessor account_batch2_0001 has not arrived in 1s" in output(service)
    registered = BatchLog(Lake(home / "lake")).registered_files()
    assert missing not in registered and "Account_batch2_0003.txt" in registered

    (landing / missing).write_bytes(contents[missing])
    feed_audits(data, home)
    final = start_stream(home, "--idle-exit", "3", env=env)
    assert wait(final) == 0, output(final)
    got = snapshot(home)
    extra = [r for r in got["delta"]["dimessages"] if r not in expected["delta"]["dimessages"]]
    assert [(r["messagesource"], r["messagetype"], r["messagetext"]) for r in extra] == [
        ("staging.account", "Quality", "Quality check failed: predecessor_present")
    ]
    for table, rows in expected["delta"].items():
        if table != "dimessages":
            assert got["delta"][table] == rows, f"{table} differs from the whole load"
    assert [r for r in got["delta"]["dimessages"] if r not in extra] == expected["delta"]["dimessages"]


def test_the_driver_jvm_killed_under_the_stream_starts_again_and_the_stream_goes_on(data, reference, tmp_path):
    """The service's driver JVM is killed with SIGKILL (as the kernel's out-of-memory killer does) in the middle of
    Batch1's stage, its sources parsed by Spark's executors (paused right after the first staging commit,
    BatchDate's, with the larger sources still to parse): the run fails, the service says that the JVM exited and
    how, starts a new JVM on the retry, and ends with the warehouse of `streamdi load` of Batch1 and Batch2."""
    expected, _, _ = reference
    home = tmp_path / "home"
    home.mkdir()
    paused = tmp_path / "paused"
    service = start_stream(
        home,
        "--idle-exit",
        "4",
        env={
            **env_for(home, executors=True),
            "STREAMDI_FAULT_AT": "lake.after_commit:stage/cashtransaction",
            "STREAMDI_FAULT_PAUSE": str(paused),
        },
    )
    try:
        wait_running(home, service)
        for batch in (1, 2):
            deliver_batch(data, batch, home / "landing")
        wait_paused(paused, service, output=lambda: output(service))
        kill_driver_jvm(service.pid)
        paused.unlink()
        assert wait(service) == 0, output(service)
    finally:  # a failure above must not leave the service waiting at its fault point
        paused.unlink(missing_ok=True)
        if service.poll() is None:
            service.kill()
            service.wait(60)
            embedded_pg.stop_server(Settings(home=home))  # a killed service cannot stop its server
    log = output(service)
    assert "micro-batch run failed (attempt 1): the Spark driver JVM exited (killed by SIGKILL" in log, log
    assert "the stream goes on after 1 failed attempt(s)" in log, log
    assert_equals_reference(home, expected)


def test_postgresql_stopped_under_the_stream_is_retried_and_the_stream_goes_on(data, reference, tmp_path):
    """The embedded PostgreSQL server is stopped (`streamdi db stop`) while the service runs: the next migration
    fails, the service reports the error in its status, retries with the warehouse opened afresh (which starts the
    server again) and ends with the whole load's warehouse."""
    expected, _, after_batch1 = reference
    home = tmp_path / "home"
    copy_home(after_batch1, home)
    deliveries, contents = plan(data / "Batch2", DripOptions(parts=4, seed=3))
    landing = home / "landing"
    landing.mkdir(parents=True, exist_ok=True)
    service = start_stream(home, "--idle-exit", "4")
    first = [d.file for d in deliveries if d.part == 0]
    for name in first:
        (landing / name).write_bytes(contents[name])
    deadline = time.monotonic() + 300
    while True:  # until the first part is visible in PostgreSQL
        batch_log = BatchLog(Lake(home / "lake"))
        if set(first) <= set(batch_log.registered_files()) and not batch_log.pending():
            break
        assert time.monotonic() < deadline and service.poll() is None, output(service)
        time.sleep(0.5)
    stopped = subprocess.run([STREAMDI, "db", "stop"], env=env_for(home), capture_output=True, text=True)
    assert stopped.returncode == 0, stopped.stderr
    for d in deliveries:
        if d.part > 0:
            (landing / d.file).write_bytes(contents[d.file])
    feed_audits(data, home)
    assert wait(service) == 0, output(service)
    log = output(service)
    assert "micro-batch run failed (attempt 1)" in log and "the stream goes on after 1 failed attempt(s)" in log, log
    assert_equals_reference(home, expected)
