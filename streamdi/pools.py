"""Thread pools kept for a process's life, one per name.

A long-lived process (the stream service) runs every micro-batch on the same threads instead of starting new ones.
(`streamdi.lake.Lake` lends its open Delta tables to any thread, `streamdi.lending`, so a new thread no longer opens
them again.)
Used by the transform's steps (`jobs.transform`), their warehouse suites (`jobs.validate`), T2's Prospect
(`jobs.create_accounts`), the stage's commits (`jobs.stage`), the migration's read-ahead (`streamdi.migrator`) and
the migration beside the transform (`streamdi.run.pipeline`).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_POOLS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def kept_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The process's pool `name` (threads named after it), made with `workers` threads on first use."""
    with _LOCK:
        if name not in _POOLS:
            _POOLS[name] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        return _POOLS[name]
