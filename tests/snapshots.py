"""Snapshots of a STREAMDI_HOME's warehouse for tests that compare two runs: every Delta warehouse table's rows, read
with delta-rs (no Spark), sorted as text so that two equal tables compare equal whatever their file layout."""

from __future__ import annotations

from pathlib import Path


def delta_warehouse(home: Path) -> dict[str, list[str]]:
    """Every Delta warehouse table's rows under `home` (sorted, as text), by table name."""
    from deltalake import DeltaTable

    root = home / "lake" / "warehouse"
    return {
        t.name: sorted(map(repr, DeltaTable(str(t)).to_pyarrow_table().to_pylist()))
        for t in sorted(root.iterdir())
        if (t / "_delta_log").is_dir()
    }
