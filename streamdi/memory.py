"""Giving the memory a process has freed back to the system (glibc's `malloc_trim`).

glibc keeps what a program frees in its heaps for later allocations, and raises its threshold for serving
allocations from their own mappings as large blocks come and go (up to 32 MiB), so after a few big numpy and
Python allocations the arrays of a step live in the heaps, and what the step frees stays there: a load's RSS holds
memory nothing uses. Measured on SF 30 Batch1 (bench/README.md, a fourteenth session): ~1 GiB of such memory after
the transform, and a peak ~0.7 GiB higher than with it given back. `keep_giving_back` starts one daemon thread per
process that calls `malloc_trim(0)` every few seconds (`Settings.malloc_trim_seconds`); the call releases the free
pages of every heap, not only the top of the main one, and holds no Python lock while it works. Where there is no
glibc (musl, macOS) nothing is done. delta-rs's allocator keeps memory of its own, which this does not touch.

Arrow's memory pool is its own allocator too. pyarrow's default, mimalloc, kept what a step had freed: SF 100 Batch1's
T1 left the process at 3.9 GiB with 0 bytes allocated in the pool, and AG's trades peaked at 6.8 GiB with 3.1 GiB
allocated. `use_returning_pool` makes jemalloc the default pool (pyarrow builds its jemalloc to hand freed pages back
within about a second: a decay of 1,000 ms, purged by a background thread): the same T1 3.15 GiB at its peak and 0.9
GiB after, AG's trades 5.6 GiB (bench/README.md, a twenty-first session). A decay of 0 cost a warm micro-batch
10-17% more CPU, and 5 s saved nothing measurable (a twenty-eighth session), so pyarrow's is kept.
The environment variable `ARROW_DEFAULT_MEMORY_POOL` (Arrow's own: `mimalloc`, `jemalloc`, `system`), when set,
chooses instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time

import psutil
import pyarrow as pa

MIB = 1024 * 1024


def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()
_LOCK = threading.Lock()
_STARTED: list[threading.Thread] = []


def use_returning_pool() -> str:
    """Make jemalloc Arrow's default memory pool, unless `ARROW_DEFAULT_MEMORY_POOL` names one or this pyarrow has no
    jemalloc (Windows); the name of the default pool. Buffers allocated before stay in the pool they came from."""
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        with contextlib.suppress(NotImplementedError):  # built without jemalloc
            pa.set_memory_pool(pa.jemalloc_memory_pool())
    return pa.default_memory_pool().backend_name


def give_back() -> bool:
    """Return the free memory of glibc's heaps to the system now. False when none was returned, or without glibc."""
    return bool(_TRIM(0)) if _TRIM is not None else False


def keep_giving_back(seconds: float) -> bool:
    """Give freed memory back every `seconds` from a daemon thread, started once per process (a later call with
    another interval changes nothing). False when not started: `seconds` is 0, or there is no glibc."""
    if seconds <= 0 or _TRIM is None:
        return False
    with _LOCK:
        if not _STARTED:
            thread = threading.Thread(target=_every, args=(seconds,), name="give-back-memory", daemon=True)
            thread.start()
            _STARTED.append(thread)
    return True


def _every(seconds: float) -> None:
    while True:
        time.sleep(seconds)
        give_back()


def footprint(held_bytes: int) -> dict[str, float]:
    """This process's memory in MiB: resident (RSS), allocated in Arrow's default pool, and of that the rows of the
    resident tables the lake holds (`held_bytes`, within `Settings.resident_mb`). For an always-on process's status:
    RSS growing while the two others stay flat is memory outside Arrow (Python objects, delta-rs, the heaps)."""
    return {
        "resident_mb": round(psutil.Process().memory_info().rss / MIB, 1),
        "arrow_mb": round(pa.total_allocated_bytes() / MIB, 1),
        "held_tables_mb": round(held_bytes / MIB, 1),
    }
