"""The warm Great Expectations server (`streamdi.gx_remote`, `streamdi.run.gx_server`), a real process on a real Unix
socket: it gives the outcomes a process's own validator gives, processes share one server and never import Great
Expectations themselves, two first starts make one server, a killed server is started again, a server that cannot
start leaves the client to validate itself, and it stops when idle or asked to. Each test has its own server folder
(TMPDIR), so no server of the developer's is touched."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest
from builders import staged_trades

from streamdi import gx_remote, quality
from streamdi.quality import RemoteValidator
from streamdi.suites import load_suites

pytestmark = pytest.mark.integration


@pytest.fixture
def server_dir(monkeypatch):
    """A short temporary folder for this test's servers (a Unix socket's path has at most 107 bytes), their servers
    stopped and the folder removed afterwards."""
    root = tempfile.mkdtemp(prefix="gx", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", root)
    monkeypatch.setenv("TMPDIR", root)
    yield root
    gx_remote.stop_all()
    for pid in _server_pids(root):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def _server_pids(root: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "streamdi.run.gx_server"], capture_output=True, text=True, check=False)
    pids = []
    for pid in map(int, out.stdout.split()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"TMPDIR={root}".encode() in environ:
            pids.append(pid)
    return pids


# two bad statuses, a zero quantity, a negative bid and a repeated t_id among six lines
ROWS = staged_trades(
    (1, "CMPT", 10, "20.00"),
    (2, "XXXX", 5, "20.00"),
    (3, "SBMT", 0, "20.00"),
    (2, "PNDG", 5, "-1.00"),
    (5, "YYYY", 7, "20.00"),
    (6, "CNCL", 1, "1.50"),
    batch=3,
)


def _ping(validator: RemoteValidator) -> int:
    with validator._lock:
        assert validator._connected()
        gx_remote.send(validator._conn, ("ping",))
        return gx_remote.recv(validator._conn)[1]


def test_the_server_gives_the_outcomes_of_the_process_validator(server_dir):
    suites = load_suites(registry=False)
    remote = RemoteValidator(suites, idle_timeout=60)
    suite = suites["staging.trade"]
    got = remote.validate(suite, ROWS, batch_id=3)

    failed = {o.check.id: (o.action, o.unexpected_count, o.element_count) for o in got.outcomes if not o.success}
    assert failed == {
        "status_is_a_status_code": ("quarantined", 2, 6),
        "quantity_is_positive": ("quarantined", 1, 6),
        "bid_price_not_negative": ("quarantined", 1, 6),
        "one_line_per_trade": ("warned", 2, 6),
    }
    assert got.kept.column("line_no").to_pylist() == [1, 6]
    assert got.quarantined.column("check_ids").to_pylist() == [
        "status_is_a_status_code",
        "quantity_is_positive",
        "bid_price_not_negative",
        "status_is_a_status_code",
    ]
    assert [json.loads(k) for k in got.quarantined.column("row_key").to_pylist()] == [
        {"source_file": "Batch3/Trade.txt", "line_no": n} for n in (2, 3, 4, 5)
    ]

    here = quality.local_validator().validate(load_suites()["staging.trade"], ROWS, batch_id=3)
    assert [(o.check.id, o.success, o.element_count, o.unexpected_count, o.action) for o in got.outcomes] == [
        (o.check.id, o.success, o.element_count, o.unexpected_count, o.action) for o in here.outcomes
    ]
    assert [sorted(map(str, o.failing_values)) for o in got.outcomes] == [
        sorted(map(str, o.failing_values)) for o in here.outcomes
    ]
    assert got.kept.equals(here.kept) and got.quarantined.equals(here.quarantined)


PROCESS = """
    import json, sys
    sys.path[:0] = [{tests!r}, {here!r}]
    from test_gx_server import ROWS
    from streamdi import quality
    validator = quality.validator()
    suite = validator.suite_for(__import__("schemas").sources.TRADE.staging)
    checked = validator.validate(suite, ROWS, batch_id=3)
    from test_gx_server import _ping
    print(json.dumps({{"kept": checked.kept.column("line_no").to_pylist(), "server": _ping(validator),
                      "gx_here": "great_expectations" in sys.modules}}))
"""


def _processes(count: int) -> list[dict]:
    here = os.path.dirname(__file__)
    code = textwrap.dedent(PROCESS.format(tests=os.path.dirname(here), here=here))
    started = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    out = []
    for process in started:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_processes_started_together_share_one_server_and_never_import_great_expectations(server_dir):
    first = _processes(3)
    later = _processes(1)
    assert [p["kept"] for p in first + later] == [[1, 6]] * 4
    assert not any(p["gx_here"] for p in first + later)
    assert len({p["server"] for p in first + later}) == 1
    # A server started by a client that lost the race tries the lock for LOCK_TRIES x 20 ms, then exits without
    # serving: on a busy machine it may still be trying when the clients are done. None may stay.
    deadline = time.monotonic() + 30
    while _server_pids(server_dir) != [first[0]["server"]] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _server_pids(server_dir) == [first[0]["server"]]


def test_a_killed_server_is_started_again(server_dir):
    remote = RemoteValidator(load_suites(registry=False), idle_timeout=60)
    suite = remote.suites["staging.trade"]
    assert remote.validate(suite, ROWS, 3).kept.num_rows == 2
    old = _ping(remote)
    os.kill(old, signal.SIGKILL)
    assert remote.validate(suite, ROWS, 3).kept.num_rows == 2
    assert _ping(remote) != old
    assert remote._local is None  # validated by the new server, not in this process


def test_a_server_that_cannot_start_leaves_the_client_to_validate_itself(server_dir, monkeypatch, caplog):
    monkeypatch.setattr(gx_remote, "SERVER_MODULE", "streamdi.no_such_server")
    remote = RemoteValidator(load_suites(registry=False), idle_timeout=60)
    checked = remote.validate(remote.suites["staging.trade"], ROWS, 3)
    assert checked.kept.column("line_no").to_pylist() == [1, 6]
    assert remote._local is quality.local_validator()
    assert "validating in this process: the Great Expectations server exited with 1" in caplog.text
    assert "No module named streamdi.no_such_server" in caplog.text


def test_the_server_stops_when_idle_and_when_asked(server_dir):
    idle = RemoteValidator(load_suites(registry=False), idle_timeout=1)
    idle.validate(idle.suites["staging.trade"], ROWS, 3)
    pid = _ping(idle)
    idle._conn.close()  # its last client goes
    deadline = time.monotonic() + 30
    while pid in _server_pids(server_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in _server_pids(server_dir)
    assert not list(gx_remote.folder().glob("*.sock"))

    asked = RemoteValidator(load_suites(registry=False), idle_timeout=0)  # never idle: only the stop ends it
    asked.wait_ready()
    pid = _ping(asked)
    out = subprocess.run(
        [sys.executable, "-m", "streamdi.run.cli", "quality", "stop"], capture_output=True, text=True, check=True
    )
    assert "stopped 1 Great Expectations server(s)." in out.stdout
    deadline = time.monotonic() + 30
    while pid in _server_pids(server_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in _server_pids(server_dir)


def test_a_slice_of_a_large_table_travels_in_record_batches_and_alone(server_dir):
    """A slice sends its own rows only, in several record batches on the wire (`gx_remote.TABLE_CHUNK_ROWS`)."""
    big = pa.concat_tables([ROWS] * 20_000)  # 120,000 rows
    part = big.slice(6, 90_000)  # 15,000 whole copies of ROWS: two record batches
    remote = RemoteValidator(load_suites(registry=False), idle_timeout=60)
    got = remote.validate(remote.suites["staging.trade"], part, batch_id=3)
    failed = {o.check.id: (o.unexpected_count, o.element_count) for o in got.outcomes if not o.success}
    assert failed["status_is_a_status_code"] == (30_000, 90_000)
    assert failed["quantity_is_positive"] == (15_000, 90_000)
    assert got.kept.num_rows == 30_000 and got.quarantined.num_rows == 60_000
