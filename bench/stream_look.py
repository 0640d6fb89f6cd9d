"""The stream service's look at the landing zone (`StreamService._look`, every `--poll` seconds, 0.05 by default)
against the history of a drip: a landing zone whose `_drip/` holds the manifests of N TPC-DI batches, all of their
files registered, and one part of batch N+2 waiting (round cuts). A look should cost the batches still arriving,
not every manifest ever written: prints milliseconds per look for each N.

    .venv/bin/python bench/stream_look.py 10 200 1000 5000
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import types
from pathlib import Path
from typing import Annotated

import typer

from streamdi.run.stream import StreamService
from streamdi.run.stream_cuts import Trigger
from streamdi.settings import Settings

SOURCES = ("Account", "Customer", "Trade", "CashTransaction", "HoldingHistory", "WatchHistory", "DailyMarket")
LOOKS = 50


def _manifest(landing: Path, batch: int) -> list[str]:
    files = [f"{source}_batch{batch}_0000.txt" for source in SOURCES]
    deliveries = [{"file": f, "part": 0, "kind": "original"} for f in files]
    (landing / "_drip" / f"batch{batch}_manifest.json").write_text(json.dumps({"deliveries": deliveries}))
    return files


def look_ms(batches: int, scratch: Path) -> float:
    """Milliseconds per look of a service whose landing zone has the manifests of `batches` registered batches."""
    settings = Settings(home=Path(tempfile.mkdtemp(dir=scratch)))
    landing = settings.landing_dir
    (landing / "_drip").mkdir(parents=True)
    registered = {f for batch in range(2, batches + 2) for f in _manifest(landing, batch)}
    waiting = _manifest(landing, batches + 2)[0]
    (landing / waiting).write_text("x\n")
    settled = time.time() - 60  # the directories as a running service sees them: not changed in the last seconds
    for directory in (landing / "_drip", landing):
        os.utime(directory, (settled, settled))
    service = StreamService(types.SimpleNamespace(settings=settings), Trigger(cut="round"))
    service._registered = registered
    service._look()  # the first look reads every manifest
    started = time.perf_counter()
    for _ in range(LOOKS):
        service._look()
    assert service._round is not None and service._round.files == {waiting}
    return (time.perf_counter() - started) / LOOKS * 1000


def main(
    batches: Annotated[list[int], typer.Argument(help="numbers of TPC-DI batches dripped before")] = None,  # noqa: B008
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        for n in batches or [10, 200, 1000, 5000]:
            print(f"{n:6d} manifests in the landing zone: {look_ms(n, Path(scratch)):7.2f} ms a look")


if __name__ == "__main__":
    typer.run(main)
