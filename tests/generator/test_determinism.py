"""Same seed and scale factor, same bytes: no global random state, no clock, no dependence on call order."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np

from streamdi.generator import Params, generate


def _digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_two_runs_with_the_same_seed_write_byte_identical_files(dataset: Path, tmp_path: Path):
    np.random.seed(12345)  # global random state must not matter
    random.seed(999)
    generate(Params(scale_factor=0.1, seed=7, batches=3), tmp_path / "again")
    first, second = _digests(dataset), _digests(tmp_path / "again")
    assert len(first) == 473  # 3 BatchDate + 12 Batch1 files + 202 FINWIRE quarters, their audits, top audits
    assert first == second


def test_another_seed_gives_other_data_in_the_same_layout(dataset: Path, tmp_path: Path):
    generate(Params(scale_factor=0.1, seed=8, batches=3), tmp_path / "other")
    first, other = _digests(dataset), _digests(tmp_path / "other")
    assert first.keys() == other.keys()
    assert first["Batch1/Trade.txt"] != other["Batch1/Trade.txt"]
    assert first["Batch1/TaxRate.txt"] == other["Batch1/TaxRate.txt"]  # fixed reference data


def test_fractional_scale_factors_give_a_usable_data_set(tmp_path: Path):
    out = generate(Params(scale_factor=0.01, seed=1, batches=2), tmp_path)
    rows = {f.path: f.rows for f in out.files}
    assert rows["Batch1/BatchDate.txt"] == 1
    assert rows["Batch1/HR.csv"] == 50  # 5000 per SF
    assert rows["Batch1/CustomerMgmt.xml"] == 50  # 5000 actions per SF
    assert rows["Batch1/Prospect.csv"] == 50
    assert rows["Batch2/Prospect.csv"] == 51  # a full snapshot plus one new prospect
    assert not (tmp_path / "Batch3").exists()


ONE_CORE = """
import os, sys
import pyarrow as pa
os.sched_setaffinity(0, {0})  # one core for this process and every thread it starts
pa.set_cpu_count(1)
pa.set_io_thread_count(1)
from pathlib import Path
from streamdi.generator import Params, generate
generate(Params(scale_factor=0.1, seed=7, batches=3), Path(sys.argv[1]))
"""


def test_one_core_writes_the_same_bytes_as_all_cores(dataset: Path, tmp_path: Path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", ONE_CORE, str(tmp_path / "one-core")], check=True, env=env, timeout=300)
    assert _digests(tmp_path / "one-core") == _digests(dataset)


# Digests of files written before the generator wrote large files piece by piece (SF 0.1, seed 7): the pieces
# must not change a byte.
PINNED = {
    "Batch1/Trade.txt": "813b149abad4d05d",
    "Batch1/DailyMarket.txt": "4fbc89c5063d28bd",
    "Batch1/CashTransaction.txt": "d7f62d4a9a888e66",
    "Batch1/TradeHistory.txt": "196b98a3fc3b73ce",
    "Batch1/HoldingHistory.txt": "37df56ba7d71df75",
    "Batch1/WatchHistory.txt": "25d8a54623795f59",
    "Batch2/Trade.txt": "1c194a3db732cae5",
    "Batch2/DailyMarket.txt": "c729efe325127da4",
    "Batch2/CashTransaction.txt": "835cccee29cfcca0",
    "Batch3/WatchHistory.txt": "49330c4987119c6a",
}


def test_files_written_in_small_pieces_are_byte_identical_to_the_pinned_ones(
    dataset: Path, tmp_path: Path, monkeypatch
):
    from streamdi.generator import market, text

    whole = _digests(dataset)
    assert {name: whole[name][:16] for name in PINNED} == PINNED
    pieces = text._pieces
    monkeypatch.setattr(market, "PIECE_ROWS", 997)
    monkeypatch.setattr(market, "DAYS_PER_PIECE", 3)
    monkeypatch.setattr(text, "_pieces", lambda n, width: pieces(n, width, cells=1000))
    generate(Params(scale_factor=0.1, seed=7, batches=3), tmp_path / "pieces")
    assert _digests(tmp_path / "pieces") == whole
