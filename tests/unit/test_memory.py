"""streamdi.memory: freed memory given back to the system (glibc's heaps, Arrow's pool), measured on a process of its
own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROGRAM = """
import json, os, threading, time
from streamdi import memory

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

# ~200 MB of 2,000-byte blocks from glibc's heap (too big for Python's own allocator), every 100th kept: the heap
# cannot shrink from its top, so what was freed stays in the process until it is given back
blocks = [bytes(2000) for _ in range(100_000)]
kept = blocks[::100]
del blocks
held = rss()
given = memory.give_back()
after = rss()
started = [memory.keep_giving_back(0), memory.keep_giving_back(0.05), memory.keep_giving_back(0.05)]
threads = [t.name for t in threading.enumerate() if t.name == "give-back-memory"]
blocks = [bytes(2000) for _ in range(100_000)]
kept2 = blocks[::100]
filled = rss()
del blocks
time.sleep(0.5)  # the thread gives it back by itself
print(json.dumps({"held": held, "given": given, "after": after, "started": started, "threads": threads,
                  "filled": filled, "later": rss()}))
"""


def test_memory_freed_to_glibcs_heap_goes_back_to_the_system_now_and_from_the_thread():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True, timeout=120)
    found = json.loads(out.stdout)
    mib = 1 << 20
    assert found["given"] is True
    assert found["held"] - found["after"] > 100 * mib  # ~198 MB freed by the program, given back
    # 0 starts nothing; the first interval starts the one thread, a second call adds none
    assert found["started"] == [False, True, True]
    assert found["threads"] == ["give-back-memory"]
    assert found["filled"] - found["later"] > 100 * mib


POOL = """
import json, os
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamdi import memory

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

chosen = memory.use_returning_pool()
numbers = np.arange(50_000_000)
base = rss()
data = pc.add(numbers, 1)  # 400 MB from the default pool
filled = rss()
del data
print(json.dumps({"chosen": chosen, "default": pa.default_memory_pool().backend_name, "held": filled - base,
                  "left": rss() - base}))
"""


def _pool_run(env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", POOL], env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_arrows_pool_is_one_that_hands_freed_memory_back_unless_the_environment_names_one():
    returning = _pool_run({})
    assert (returning["chosen"], returning["default"]) == ("jemalloc", "jemalloc")
    assert returning["held"] > 350 * 2**20
    assert returning["left"] < 100 * 2**20  # the 400 MB went back to the system when freed
    named = _pool_run({"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"})
    assert (named["chosen"], named["default"]) == ("mimalloc", "mimalloc")
    assert named["left"] > 350 * 2**20  # pyarrow's default keeps it (what the returning pool is for)
