"""Generator throughput: rows/s of `streamdi generate` at a few scale factors (timing goals live here, not in tests).

Usage: .venv/bin/python bench/generate.py [--sf 0.1 1] [--repeat 2] [--out DIR]
Prints one line per run (SF, rows, bytes, seconds, rows/s) and the best rows/s per SF; the target is
150,000 rows/s at SF >= 1.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer

from streamdi.generator import Params, generate
from streamdi.scripts import script_app

TARGET_ROWS_PER_SECOND = 150_000


app = script_app()


@app.command(
    context_settings={"allow_extra_args": True, "help_option_names": ["-h", "--help"]}, help=__doc__.splitlines()[0]
)
def main(
    context: typer.Context,
    sf: Annotated[
        list[float],
        typer.Option(help="scale factors; several after one --sf (--sf 0.1 1) or --sf repeated"),
    ] = [0.1, 1.0],  # noqa: B006 - typer copies the default
    repeat: Annotated[int, typer.Option()] = 2,
    out: Annotated[Path | None, typer.Option(help="scratch directory (default: a temporary one)")] = None,
) -> None:
    args = SimpleNamespace(**locals())  # the options by name, as the rest of main reads them
    try:  # `--sf 0.1 1`: the values after the first are left over as extra arguments
        args.sf = [*sf, *(float(value) for value in context.args)]
    except ValueError:
        raise typer.BadParameter(f"not scale factors: {' '.join(context.args)}", param_hint="--sf") from None
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
    app()
