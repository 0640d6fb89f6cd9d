"""Generator throughput: rows/s of `streamdi generate` at a few scale factors (timing goals live here, not in tests).

Usage: .venv/bin/python bench/generate.py [--sf 0.1 1] [--repeat 2] [--out DIR]
Prints one line per run (SF, rows, bytes, seconds, rows/s) and the best rows/s per SF; the target is
150,000 rows/s at SF >= 1.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from streamdi.generator import Params, generate

TARGET_ROWS_PER_SECOND = 150_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    scratch = args.out or Path(tempfile.mkdtemp(prefix="streamdi-bench-"))
    best: dict[float, float] = {}
    try:
        for sf in args.sf:
            for run in range(args.repeat):
                target = scratch / f"sf{sf}-{run}"
                shutil.rmtree(target, ignore_errors=True)
                started = time.perf_counter()
                out = generate(Params(scale_factor=sf, seed=0), target)
                seconds = time.perf_counter() - started
                rate = out.rows / seconds
                best[sf] = max(best.get(sf, 0.0), rate)
                line = f"SF {sf:<6} run {run}: {out.rows:>11,} rows {out.bytes:>14,} bytes"
                print(f"{line} {seconds:7.2f} s {rate:>10,.0f} rows/s")
                shutil.rmtree(target, ignore_errors=True)
    finally:
        if args.out is None:
            shutil.rmtree(scratch, ignore_errors=True)
    for sf, rate in best.items():
        ratio = rate / TARGET_ROWS_PER_SECOND
        print(f"best SF {sf}: {rate:,.0f} rows/s = {ratio:.2f} x target ({TARGET_ROWS_PER_SECOND:,})")


if __name__ == "__main__":
    main()
