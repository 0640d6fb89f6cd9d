"""What step DM's counts leave for the next process (`jobs.messages.validation_counts`).

The joined counts of the fact tables are kept per data file while no dimension key has gone (`jobs.messages`);
a warm process holds them in memory, and a new one (a `streamdi load`, an Airflow task, the stream's first
micro-batch) would read and probe every fact row again: ~0.4 s of SF 3's incremental batch. So the keys they were
counted under (with their epoch) and each file's figure are also left under the lake's root, in `KEPT_DIR`, and a
new process starts from them. Arrow IPC files, each written whole and then renamed into place (a crash leaves the
previous file); a file that cannot be read counts as absent, and the counts are then made again. The keys are
written before any count made under them, so a count on disk was made under keys all of which are in the keys on
disk; a data file's figure and its rows that did not join are in one file, so they always belong together.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Table

KEPT_DIR = "_streamdi_kept/validation_counts"  # under the lake's root


class Kept:
    """The keys and counts kept under `<lake root>/KEPT_DIR` (the module docstring says why and how)."""

    def __init__(self, root: Path) -> None:
        self.folder = root / KEPT_DIR

    def keys(self) -> tuple[int, dict[tuple[str, str], pa.Array]]:
        kept = self._read("keys.arrow")
        if kept is None:
            return 0, {}
        meta = json.loads(kept.schema.metadata[b"streamdi"])
        column, keys, start = kept["key"].combine_chunks(), {}, 0
        for name, key, length in meta["idents"]:
            keys[(name, key)] = column.slice(start, length)
            start += length
        return meta["epoch"], keys

    def keep_keys(self, epoch: int, keys: Mapping[tuple[str, str], pa.Array]) -> None:
        idents = [[name, key, len(values)] for (name, key), values in keys.items()]
        rows = pa.table({"key": pa.concat_arrays([v.cast(pa.int64()) for v in keys.values()])})
        meta = {"streamdi": json.dumps({"epoch": epoch, "idents": idents})}
        self._write("keys.arrow", rows.replace_schema_metadata(meta))

    def counts(self, table: Table, epoch: int) -> dict[str, tuple[int, pa.Table]]:
        """The per-file counts kept for `table` under `epoch` (none under another): one file holds both a data file's
        count and its rows that did not join, which together make its figure."""
        kept = self._read(f"{table.name}.arrow")
        if kept is None:
            return {}
        meta = json.loads(kept.schema.metadata[b"streamdi"])
        if meta["epoch"] != epoch:
            return {}
        rows = kept.drop_columns(["file"])
        return {
            file: (joined, rows.filter(pc.equal(kept["file"], file)) if kept.num_rows else rows)
            for file, joined in meta["joined"].items()
        }

    def keep_counts(self, table: Table, epoch: int, counts: Mapping[str, tuple[int, pa.Table]]) -> None:
        if not counts:
            return
        left = pa.concat_tables(
            [rows.append_column("file", pa.array([f] * rows.num_rows, pa.string())) for f, (_, rows) in counts.items()]
        )
        meta = {"epoch": epoch, "joined": {f: n for f, (n, _) in counts.items()}}
        self._write(f"{table.name}.arrow", left.replace_schema_metadata({"streamdi": json.dumps(meta)}))

    def _read(self, name: str) -> pa.Table | None:
        try:
            with pa.OSFile(str(self.folder / name)) as source:
                return pa.ipc.open_file(source).read_all()
        except (OSError, pa.ArrowInvalid):
            return None

    def _write(self, name: str, rows: pa.Table) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        scratch = self.folder / f".{name}.{os.getpid()}.{threading.get_ident()}"
        with pa.OSFile(str(scratch), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
            writer.write_table(rows)
        os.replace(scratch, self.folder / name)
