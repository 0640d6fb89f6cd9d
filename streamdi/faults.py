"""Named fault points for crash tests.

Code calls `fault_point("name")` at the places where a crash matters (between two commits, inside a
Postgres transaction, ...). When the environment variable `STREAMDI_FAULT_AT` names that point, the process
kills itself with SIGKILL — no cleanup, no `finally`, exactly like a power cut — so fault-injection tests
run real subprocesses and check that a rerun converges. `name#N` kills at the N-th time the point is reached
in the process (e.g. `lake.after_commit#7`: right after the 7th Delta commit). Unset (always, in production)
it costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "STREAMDI_FAULT_AT"
_reached: Counter[str] = Counter()


def fault_point(name: str) -> None:
    target = os.environ.get(ENV)
    if not target:
        return
    point, _, nth = target.partition("#")
    if point != name:
        return
    _reached[name] += 1
    if not nth or _reached[name] == int(nth):
        os.kill(os.getpid(), signal.SIGKILL)
