"""Writing generated files: the data files, their `<Source>_audit.csv` and the per-batch bookkeeping.

Audit figures are counted from the rows actually handed to `write_file`, never from the parameters, so the
audit files always describe what is on disk.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from streamdi.generator.text import CRLF, line_chunks

AUDIT_HEADER = "DataSet, BatchID ,Date , Attribute , Value, DValue"


@dataclass(frozen=True)
class AuditRow:
    """One line of an audit file: (DataSet, BatchID, Date, Attribute, Value, DValue)."""

    dataset: str
    batch: int
    attribute: str
    value: int | None = None
    date: dt.date | None = None
    dvalue: str | None = None

    def line(self) -> str:
        cells = (
            self.dataset,
            str(self.batch),
            "" if self.date is None else self.date.isoformat(),
            self.attribute,
            "" if self.value is None else str(self.value),
            "" if self.dvalue is None else self.dvalue,
        )
        return ",".join(cells)


def audit_bytes(rows: list[AuditRow]) -> bytes:
    return (CRLF.join([AUDIT_HEADER, *(r.line() for r in rows)]) + CRLF).encode()


@dataclass
class WrittenFile:
    path: str  # relative to the output directory
    rows: int
    bytes: int


@dataclass
class Output:
    """The output directory and a record of every file written (for the summary and the tests)."""

    root: Path
    on_file: Callable[[WrittenFile], None] | None = None
    files: list[WrittenFile] = field(default_factory=list)

    def write(self, relative: str, content: bytes, rows: int) -> WrittenFile:
        return self._record(relative, rows, self._store(relative, [content]))

    def write_lines(self, relative: str, lines: pa.Array | list[str] | Iterator[pa.Array]) -> WrittenFile:
        """Write lines (a list, an Arrow array, or an iterator of Arrow arrays written one after the other, so a
        large file never has all its text in memory), each ended by CRLF."""
        pieces = lines if isinstance(lines, Iterator) else iter([lines])
        rows = 0

        def parts() -> Iterator[bytes | memoryview]:
            nonlocal rows
            for piece in pieces:
                rows += len(piece)
                yield from line_chunks(piece)

        size = self._store(relative, parts())
        return self._record(relative, rows, size)

    def _store(self, relative: str, parts: Iterable[bytes | memoryview]) -> int:
        """Write the file under a temporary name, then rename it: a file on disk is always whole. Returns its
        size in bytes."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        size = 0
        with tmp.open("wb") as f:
            for part in parts:
                size += f.write(part)
        tmp.replace(path)
        return size

    def _record(self, relative: str, rows: int, size: int) -> WrittenFile:
        written = WrittenFile(relative, rows, size)
        self.files.append(written)
        if self.on_file:
            self.on_file(written)
        return written

    def write_audit(self, relative: str, rows: list[AuditRow]) -> WrittenFile:
        return self.write(relative, audit_bytes(rows), len(rows))

    def next_dsn(self, source: str) -> int:
        """CDC_DSN of the first line of an incremental `source` file: one more than the lines of that source
        written in earlier batches (as DIGen numbers DailyMarket: Batch2 continues after Batch1's count)."""
        return 1 + sum(f.rows for f in self.files if f.path.rsplit("/", 1)[-1].split(".")[0] == source)

    @property
    def rows(self) -> int:
        """Source rows written (audit files excluded), as the official generator counts them."""
        return sum(f.rows for f in self.files if not f.path.endswith("_audit.csv"))

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)
