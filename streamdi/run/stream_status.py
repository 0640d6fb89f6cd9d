"""The stream service (`streamdi.run.stream`) seen from outside: its status file and lock, the summary `streamdi stream
status` prints, and the supervision the Airflow DAG `streamdi_stream` runs (start it detached, stop it, check it).

Reads what the service writes (`<home>/stream/status.json`) and whether it holds its lock (`<home>/stream/service.lock`,
`streamdi.locks.flock_held`); starts the service only as a process of its own (`streamdi stream`), never in-process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

from streamdi.batchlog import percentile
from streamdi.locks import flock_held
from streamdi.settings import Settings

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
LOCK_FILE = "service.lock"


def folder(settings: Settings) -> Path:
    return settings.home.absolute() / "stream"


# -- status, for `streamdi stream status` -------------------------------------------------------------------


def read_status(settings: Settings) -> tuple[dict | None, bool]:
    """The service's last status and whether its process still runs (its lock is held)."""
    path = folder(settings) / STATUS_FILE
    if not path.exists():
        return None, False
    status = json.loads(path.read_text())
    return status, flock_held(folder(settings) / LOCK_FILE)


def rows_per_second(recent: list[dict]) -> float | None:
    """Warehouse rows made visible per second of the stages' own run time over `recent`."""
    busy = sum(sum(r["seconds"].values()) for r in recent)
    return round(sum(r["rows"] for r in recent) / busy, 1) if busy > 0 else None


# -- supervision, for the Airflow DAG `streamdi_stream` ------------------------------------------------------------

ACTIONS = ("ensure", "stop", "check")
START_TIMEOUT = 180.0


def summary(status: dict | None, running: bool) -> dict:
    """What an operator needs from a status: state, lag, the last micro-batch, latency percentiles and rows/s (of the
    warm micro-batches: the service's first, on a cold Spark, is given apart), halt and error (`streamdi stream
    status` prints it; the Airflow DAG returns it)."""
    if status is None:
        return {"running": False, "state": "never started"}
    recent = status.get("recent") or []
    warm = [r for r in recent if not r.get("cold")]
    visible = [r["visible"] for r in warm if r.get("visible") is not None]
    cold = [r["visible"] for r in recent if r.get("cold") and r.get("visible") is not None]
    return {
        "running": running,
        "state": status["state"] if running else f"not running (last state: {status['state']})",
        "pid": status["pid"],
        "updated_at": status["updated_at"],
        "waiting_files": status["waiting_files"],
        "lag_seconds": status["lag_seconds"],
        "last_batch": status.get("last_batch"),
        "batches_done": status["batches_done"],
        "warm_batches": len(visible),  # the micro-batches of the percentiles (the last `RECENT`, the cold one out)
        "visible_p50_seconds": percentile(visible, 50),
        "visible_p99_seconds": percentile(visible, 99),
        "cold_visible_seconds": cold[-1] if cold else None,  # the first micro-batch, if still among the recent
        "rows_per_second": rows_per_second(warm),
        "memory": status.get("memory") or {},  # after the last micro-batch (`streamdi.memory.footprint`)
        "landing_deleted": status.get("landing_deleted", 0),  # landing files of finished micro-batches deleted
        "halt": status.get("halt"),
        "error": status.get("error"),
    }


def start_detached(settings: Settings, *args: str) -> int:
    """Start `streamdi stream` in a session of its own (it outlives the caller, e.g. an Airflow task), its output in
    `<home>/stream/service.log`; returns its pid."""
    import subprocess
    import sys

    folder(settings).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "STREAMDI_HOME": str(settings.home.absolute())}
    with open(folder(settings) / "service.log", "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamdi.run.cli", "stream", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process.pid


def supervise(settings: Settings, action: str = "ensure", *, timeout: float = START_TIMEOUT) -> dict:
    """`ensure`: start the service if it does not run and wait until it serves; `stop`: ask it to finish its
    micro-batch in flight and stop, and wait for that; `check`: only look. Returns `summary` of the status."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    status, running = read_status(settings)
    deadline = time.monotonic() + timeout
    if action == "ensure" and not running:
        pid = start_detached(settings)
        log.info("started the stream service (pid %s); output in %s", pid, folder(settings) / "service.log")
        while True:
            status, running = read_status(settings)
            if running and status is not None and status["pid"] == pid and status["state"] != "starting":
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the stream service (pid {pid}) did not start in {timeout:g} s; see its log "
                    f"{folder(settings) / 'service.log'}"
                )
            time.sleep(0.5)
    elif action == "stop" and running and status is not None:
        os.kill(status["pid"], signal.SIGTERM)
        while running and time.monotonic() < deadline:
            time.sleep(0.5)
            status, running = read_status(settings)
        if running:
            raise TimeoutError(f"the stream service (pid {status['pid']}) did not stop in {timeout:g} s")
    return summary(status, running)
