"""`streamdi airflow` stops on Ctrl-C: `airflow_cli.supervise` runs `airflow standalone` in a process group of its
own and passes a stop on to it alone (Airflow 3.3's scheduler never ended when the Ctrl-C of a terminal also reached
its LocalExecutor workers). Here a small script stands in for `airflow standalone`: it records the signals it and a
worker it started receive, in files; the supervisor runs in a process of its own, in a session like a terminal's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from chromium import wait_for

# The stand-in: starts a worker in its group, writes "ready", and on SIGINT writes "standalone SIGINT" and exits 0
# (as `airflow standalone` does after stopping its components). IGNORE_INT=1 makes it ignore SIGINT (a hang).
STANDALONE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    def note(text):
        with open(out, "a") as f:
            f.write(text + "\\n")
    worker = subprocess.Popen([sys.executable, "-c", '''
    import signal, sys, time
    def got(signum, frame):
        with open(sys.argv[1], "a") as f:
            f.write("worker " + signal.Signals(signum).name + "\\\\n")
        sys.exit(0)
    signal.signal(signal.SIGINT, got)
    signal.signal(signal.SIGTERM, got)
    while True:
        time.sleep(0.05)
    ''', out])
    def stop(signum, frame):
        note("standalone " + signal.Signals(signum).name)
        sys.exit(0)
    if os.environ.get("IGNORE_INT") == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, stop)
    with open(out + ".pid", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(0.3)
    note("ready")
    while True:
        time.sleep(0.05)
    """
)

SUPERVISOR = textwrap.dedent(
    """
    import sys
    from streamdi.airflow_cli import supervise
    sys.exit(supervise([sys.executable, sys.argv[1], sys.argv[2]], dict(__import__("os").environ), float(sys.argv[3])))
    """
)


def start(tmp_path: Path, grace: float = 30, **env) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "standalone.py"
    script.write_text(STANDALONE)
    out = tmp_path / "signals.txt"
    out.touch()
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(script), str(out), str(grace)],
        env={**os.environ, **env},
        start_new_session=True,  # a group of its own, like a shell's foreground job
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for("the stand-in to start", lambda: "ready" in out.read_text(), 30, 0.05)
    return supervisor, out


def lines(out: Path) -> list[str]:
    return out.read_text().splitlines()


def test_ctrl_c_to_the_terminals_group_reaches_the_standalone_alone_and_it_stops(tmp_path):
    supervisor, out = start(tmp_path)
    os.killpg(supervisor.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    assert supervisor.wait(30) == 0
    assert "stopping Airflow" in supervisor.stderr.read()
    # the stand-in got exactly one SIGINT; its worker none, only the SIGTERM of the clean-up after the exit
    wait_for("the worker to be stopped", lambda: any(line.startswith("worker") for line in lines(out)), 10, 0.05)
    assert lines(out) == ["ready", "standalone SIGINT", "worker SIGTERM"]


def test_sigterm_is_passed_on_as_a_sigint(tmp_path):
    supervisor, out = start(tmp_path)
    supervisor.terminate()
    assert supervisor.wait(30) == 0
    assert lines(out)[:2] == ["ready", "standalone SIGINT"]


def test_a_standalone_that_does_not_stop_is_killed_after_the_grace(tmp_path):
    supervisor, out = start(tmp_path, grace=1, IGNORE_INT="1")
    started = time.monotonic()
    os.killpg(supervisor.pid, signal.SIGINT)
    assert supervisor.wait(30) == 128 + signal.SIGKILL
    assert time.monotonic() - started >= 1
    assert "did not stop within 1 s: killing it" in supervisor.stderr.read()
    assert lines(out) == ["ready"]  # killed, workers included: no handler ran


def test_a_second_ctrl_c_kills_at_once(tmp_path):
    supervisor, out = start(tmp_path, grace=600, IGNORE_INT="1")
    os.killpg(supervisor.pid, signal.SIGINT)
    wait_for("the stop to be passed on", lambda: "stopping Airflow" in supervisor.stderr.readline(), 10, 0.05)
    os.killpg(supervisor.pid, signal.SIGINT)
    assert supervisor.wait(30) == 128 + signal.SIGKILL


def test_two_stops_at_once_kill_at_once(tmp_path):
    """Two stop signals that reach the supervisor between two of its polls (0.2 s) count as two: a kill."""
    supervisor, out = start(tmp_path, grace=600, IGNORE_INT="1")
    os.killpg(supervisor.pid, signal.SIGINT)
    os.killpg(supervisor.pid, signal.SIGTERM)
    assert supervisor.wait(30) == 128 + signal.SIGKILL


def test_the_standalone_stops_when_the_supervisor_is_killed(tmp_path):
    supervisor, out = start(tmp_path)
    supervisor.kill()
    supervisor.wait(10)
    wait_for("the stand-in to get its SIGINT", lambda: "standalone SIGINT" in lines(out), 10, 0.05)
    with contextlib.suppress(ProcessLookupError):  # its worker, orphaned with nobody to clean up after it
        os.killpg(int(Path(f"{out}.pid").read_text()), signal.SIGKILL)
