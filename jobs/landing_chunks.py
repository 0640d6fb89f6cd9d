"""Landing files cut into pieces of whole lines, for the stage's parse on Spark's executors (`jobs.stage_executors`).

The driver reads each registered file once, a block at a time (its memory does not grow with the file): it checks
the file's SHA-256 against the collector's registration (a file gone or changed raises the same `LandingFileError`
as `jobs.landing.read_registered`), and cuts it after the first line ending past every `chunk_bytes`, so each piece
holds whole lines. A piece records where it starts and ends, the number of its first line and a CRC-32 of its bytes.
An executor reads only its piece (`read_chunk`) and checks its length and CRC, so a file replaced between the
driver's check and the executor's read is caught there too. Counting the lines before a piece is what lets an
executor number its lines as the whole-file parse does.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

from jobs.landing import changed, gone
from streamdi.batchlog import BatchFile
from streamdi.collector import open_landed

READ_BLOCK = 8 << 20  # bytes the driver reads at a time


@dataclass(frozen=True)
class Chunk:
    """Bytes `start` to `end` (exclusive) of a landing file, whole lines, the first numbered `first_line`."""

    position: int  # in the plan: the order of the staged rows
    file: BatchFile
    start: int
    end: int
    first_line: int
    crc32: int
    ends_file: bool  # the piece is the end of its file (a last line without a line ending is rejected there)


def plan_chunks(landing_dir: Path, batch_id: int, files: list[BatchFile], chunk_bytes: int) -> list[Chunk]:
    """The pieces of `files`, in file order, each about `chunk_bytes` (a piece ends with the first line ending at or
    past that many bytes, or with its file). An empty file has no piece. Raises `LandingFileError` for a file that
    is gone or whose SHA-256 is not the registered one."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
    chunks: list[Chunk] = []
    for bf in files:
        chunks.extend(_file_chunks(landing_dir, batch_id, bf, chunk_bytes, len(chunks)))
    return chunks


def _file_chunks(landing_dir: Path, batch_id: int, bf: BatchFile, chunk_bytes: int, position: int) -> list[Chunk]:
    digest = hashlib.sha256()
    pieces: list[tuple[int, int, int, int]] = []  # (start, end, first line, crc32)
    start, line, crc, base = 0, 1, 0, 0  # the open piece's start, first line and CRC; the block's offset in the file
    lines = 0  # line endings in the open piece so far
    try:
        handle = open_landed(landing_dir / bf.file)
    except FileNotFoundError:
        raise gone(bf, batch_id) from None
    with handle:
        for block in iter(lambda: handle.read(READ_BLOCK), b""):
            digest.update(block)
            view = memoryview(block)
            i = 0
            while i < len(block):
                # the open piece ends with the first line ending at or past its `chunk_bytes`-th byte
                at = max(start + chunk_bytes - 1 - base, i)
                cut = block.find(b"\n", at) if at < len(block) else -1
                stop = len(block) if cut < 0 else cut + 1
                crc = zlib.crc32(view[i:stop], crc)
                lines += block.count(b"\n", i, stop)
                i = stop
                if cut >= 0:
                    pieces.append((start, base + stop, line, crc))
                    start, line, crc, lines = base + stop, line + lines, 0, 0
            base += len(block)
    offset = base
    if offset > start:  # the file's end, after its last cut
        pieces.append((start, offset, line, crc))
    if digest.hexdigest() != bf.sha256:
        raise changed(bf, batch_id, digest.hexdigest())
    return [Chunk(position + i, bf, s, e, first, c, i == len(pieces) - 1) for i, (s, e, first, c) in enumerate(pieces)]


def read_chunk(landing_dir: Path, batch_id: int, chunk: Chunk) -> bytes:
    """The bytes of `chunk`, read where the work runs; raises `LandingFileError` when they are not the planned ones
    (the file is gone, shorter, or other bytes)."""
    try:
        handle = open_landed(landing_dir / chunk.file.file)
    except FileNotFoundError:
        raise gone(chunk.file, batch_id) from None
    with handle:
        handle.seek(chunk.start)
        data = handle.read(chunk.end - chunk.start)
    if len(data) != chunk.end - chunk.start or zlib.crc32(data) != chunk.crc32:
        raise changed(chunk.file, batch_id)
    return data
