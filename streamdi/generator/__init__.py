"""Generate TPC-DI source files in the official generator's formats (`streamdi generate`).

`generate(params, out_dir)` writes `Batch1/` (historical load) and `Batch2/..BatchN/` (incremental CDC files),
each with `BatchDate.txt` and `<Source>_audit.csv`, plus `BatchN_audit.csv` and `Generator_audit.csv` at the
top, exactly as DIGen lays them out. Output depends only on (scale factor, seed, batches): every file draws
from its own seeded numpy Generator, never from global random state or the clock. See docs/generator.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STEPS", "Output", "Params", "WrittenFile", "generate"]


def __getattr__(name: str) -> Any:
    """The package's names, imported on first use (PEP 562): a command that does not generate (`streamdi load`,
    every CLI start) does not import the generator's modules and numpy with `streamdi.generator.cli`."""
    if name in ("STEPS", "generate"):
        from streamdi.generator import dataset

        return getattr(dataset, name)
    if name in ("Output", "WrittenFile"):
        from streamdi.generator import output

        return getattr(output, name)
    if name == "Params":
        from streamdi.generator.params import Params

        return Params
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
