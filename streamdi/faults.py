"""Named fault points for crash tests.

Code calls `fault_point("name")` at the places where a crash matters (between two commits, inside a
Postgres transaction, ...). When the environment variable `STREAMDI_FAULT_AT` names that point, the process
kills itself with SIGKILL — no cleanup, no `finally`, exactly like a power cut — so fault-injection tests
run real subprocesses and check that a rerun converges. `name#N` kills at the N-th time the point is reached
in the process (e.g. `lake.after_commit#7`: right after the 7th Delta commit; `lake.after_commit:T4/market_slices`:
right after the commit with that app transaction). Unset (always, in production) it costs one dict lookup.

With `STREAMDI_FAULT_PAUSE=<file>` as well, the process does not die at the point: it creates `<file>` and waits
until the file is gone, then goes on. A test does something to the world meanwhile (restarts PostgreSQL, fills
a disk) and then lets the process meet the consequence.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

ENV = "STREAMDI_FAULT_AT"
PAUSE_ENV = "STREAMDI_FAULT_PAUSE"
_reached: Counter[str] = Counter()
_counting = threading.Lock()  # steps may commit from two threads (T1 and T2)


def fault_point(name: str) -> None:
    target = os.environ.get(ENV)
    if not target:
        return
    point, _, nth = target.partition("#")
    if point != name:
        return
    with _counting:
        _reached[name] += 1
        reached = _reached[name]
    if nth and reached != int(nth):
        return
    pause = os.environ.get(PAUSE_ENV)
    if not pause:
        os.kill(os.getpid(), signal.SIGKILL)
    marker = Path(pause)
    marker.touch()
    while marker.exists():
        time.sleep(0.05)
