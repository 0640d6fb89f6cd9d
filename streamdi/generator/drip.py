"""Drip mode: deliver one generated batch into a landing zone as many small files, as a stream would.

Every delimited file of `BatchK` is cut into `parts` contiguous pieces (in file order, so CDC_DSN order is kept
inside a piece) named `<Source>_batchK_<part>.<ext>` (e.g. `Trade_batch2_0003.txt`: the collector reads the
TPC-DI batch from the name and `jobs.landing` the source). Files that are not line-delimited (CustomerMgmt.xml,
FINWIRE) travel whole. Faults, each drawn with its probability from a generator seeded by (seed, batch):

- disorder: a piece swaps its delivery slot with the one after it;
- late: a piece is held back and delivered after all others;
- duplicates: a piece is delivered a second time under another name (`..._0003_dup.txt`);
- malformed: one line of a piece is damaged (its last field cut off, or replaced by garbage).

The manifest (`_drip/batchK_manifest.json`, ignored by the collector like every `_` path) lists every
delivery with the lines it holds and the original text of every damaged line, so that the union of the
original pieces, with damaged lines restored, is exactly the batch. `*_audit.csv` files are copied to
`_drip/BatchK/` for the audit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from streamdi.generator.text import CRLF

_BATCH = re.compile(r"(?i)batch(\d+)$")
MANIFESTS = "_drip"  # under the landing zone: each dripped batch's manifest and audit files
WHOLE_FILES = re.compile(r"^(CustomerMgmt\.xml|FINWIRE\d{4}Q[1-4])$")


@dataclass(frozen=True)
class DripOptions:
    parts: int = 10
    disorder: float = 0.0
    late: float = 0.0
    duplicates: float = 0.0
    malformed: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.parts < 1:
            raise ValueError(f"--files must be at least 1, got {self.parts}")
        for name in ("disorder", "late", "duplicates", "malformed"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name} is a probability in [0, 1], got {getattr(self, name)}")


@dataclass
class Delivery:
    """One landing file: which lines of which batch file it holds, and what was done to it."""

    seq: int
    file: str
    source_file: str
    part: int
    first_line: int  # 1-based line number in the source file of the piece's first line
    lines: int
    kind: str = "original"  # or "duplicate"
    late: bool = False
    malformed: list[dict] = field(default_factory=list)  # {"line": 1-based in the piece, "original": text}


def manifest_path(landing: Path, batch: int) -> Path:
    """Where the manifest of TPC-DI batch `batch` dripped into `landing` is (written before its first file)."""
    return landing / MANIFESTS / f"batch{batch}_manifest.json"


def source_batch_of_dir(batch_dir: Path) -> int:
    match = _BATCH.search(batch_dir.name)
    if not match:
        raise ValueError(f"{batch_dir} is not a BatchN directory")
    return int(match.group(1))


def _split_lines(data: bytes) -> list[str]:
    text = data.decode("utf-8")
    if not text:
        return []
    return text[:-2].split(CRLF) if text.endswith(CRLF) else text.split(CRLF)


def _damage(line: str, rng: np.random.Generator) -> str:
    delimiter = "," if line.count(",") > line.count("|") else "|"
    if delimiter in line and rng.random() < 0.5:
        return line.rsplit(delimiter, 1)[0]  # one field short
    return "#" + line[: max(len(line) // 3, 1)] + "\x01garbage"


def _bytes(lines: list[str]) -> bytes:
    return (CRLF.join(lines) + CRLF).encode() if lines else b""


def plan(batch_dir: Path, options: DripOptions) -> tuple[list[Delivery], dict[str, bytes]]:
    """The deliveries in arrival order and each landing file's bytes (reads `batch_dir`, writes nothing)."""
    batch = source_batch_of_dir(batch_dir)
    rng = np.random.default_rng(np.random.SeedSequence([options.seed, batch]))
    pieces: list[tuple[Delivery, list[str] | bytes]] = []
    files = sorted(p for p in batch_dir.iterdir() if p.is_file() and not p.name.endswith("_audit.csv"))
    for path in files:
        stem, dot, ext = path.name.partition(".")
        if WHOLE_FILES.match(path.name):
            content = path.read_bytes()  # travels unchanged, byte for byte
            lines = len(_split_lines(content))
            pieces.append((Delivery(0, f"{stem}_batch{batch}_0000{dot}{ext}", path.name, 0, 1, lines), content))
            continue
        lines = _split_lines(path.read_bytes())
        n = max(1, min(options.parts, len(lines)))
        bounds = np.linspace(0, len(lines), n + 1).astype(int)
        for part in range(n):
            lo, hi = int(bounds[part]), int(bounds[part + 1])
            name = f"{stem}_batch{batch}_{part:04d}{dot}{ext}"
            pieces.append((Delivery(0, name, path.name, part, lo + 1, hi - lo), lines[lo:hi]))
    # interleave the sources: part 0 of every file, then part 1, ... (the files of a part in name order)
    pieces.sort(key=lambda item: (item[0].part, item[0].source_file))
    order = list(range(len(pieces)))
    for i in range(len(order) - 1):
        if rng.random() < options.disorder:
            order[i], order[i + 1] = order[i + 1], order[i]
    late = {i for i in order if rng.random() < options.late}
    order = [i for i in order if i not in late] + [i for i in order if i in late]
    out: list[tuple[Delivery, bytes]] = []
    for i in order:
        delivery, content = pieces[i]
        delivery.late = i in late
        if isinstance(content, list):
            if content and rng.random() < options.malformed:
                k = int(rng.integers(0, len(content)))
                content = list(content)
                delivery.malformed.append({"line": k + 1, "original": content[k]})
                content[k] = _damage(content[k], rng)
            content = _bytes(content)
        out.append((delivery, content))
        if rng.random() < options.duplicates:
            stem, dot, ext = delivery.file.partition(".")
            copy = Delivery(0, f"{stem}_dup{dot}{ext}", delivery.source_file, delivery.part, delivery.first_line,
                            delivery.lines, kind="duplicate", malformed=list(delivery.malformed))  # fmt: skip
            out.append((copy, content))
    for seq, (delivery, _) in enumerate(out):
        delivery.seq = seq
    return [d for d, _ in out], {d.file: c for d, c in out}


def drip(
    batch_dir: Path,
    landing: Path,
    options: DripOptions,
    rate: float | None = None,
    on_delivery: Callable[[Delivery], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Delivery]:
    """Deliver the batch into `landing` (each file written to a .tmp name, then renamed), `rate` files per
    second at most; write the manifest first so a consumer can reconcile what is still to come."""
    batch = source_batch_of_dir(batch_dir)
    deliveries, contents = plan(batch_dir, options)
    meta = landing / MANIFESTS
    (meta / f"Batch{batch}").mkdir(parents=True, exist_ok=True)
    for audit in sorted(batch_dir.glob("*_audit.csv")):
        shutil.copyfile(audit, meta / f"Batch{batch}" / audit.name)
    manifest = {
        "source_batch": batch,
        "from": str(batch_dir),
        "options": asdict(options),
        "deliveries": [asdict(d) for d in deliveries],
    }
    manifest_path(landing, batch).write_text(json.dumps(manifest, indent=1) + "\n")
    landing.mkdir(parents=True, exist_ok=True)
    for delivery in deliveries:
        content = contents[delivery.file]
        target = landing / delivery.file
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(content)
        os.replace(tmp, target)
        if on_delivery:
            on_delivery(delivery)
        if rate:
            sleep(1.0 / rate)
    return deliveries
