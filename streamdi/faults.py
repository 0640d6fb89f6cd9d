"""Named fault points for crash tests.

Code calls `fault_point("name")` at the places where a crash matters (between two commits, inside a
Postgres transaction, ...). When the environment variable `STREAMDI_FAULT_AT` names that point, the process
kills itself with SIGKILL — no cleanup, no `finally`, exactly like a power cut — so fault-injection tests
run real subprocesses and check that a rerun converges. Unset (always, in production) it costs one dict
lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "STREAMDI_FAULT_AT"


def fault_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
