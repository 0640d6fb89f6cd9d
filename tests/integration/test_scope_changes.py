"""`BatchScope.changed` on a real Delta table: a micro-batch sees the change feed of its own commits only, whether
they follow one another or another micro-batch's commit came between them."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from jobs.scope import BatchScope
from schemas.model import Column as C
from schemas.model import Table
from streamdi.lake import Lake

pytestmark = pytest.mark.integration

TABLE = Table(
    name="scoped",
    layer="warehouse",
    columns=(C("id", "int", False), C("name", "string")),
    key=("id",),
    order_by=("id",),
)


def _rows(*pairs: tuple[int, str]) -> pa.Table:
    return pa.table({"id": [p[0] for p in pairs], "name": [p[1] for p in pairs]}).cast(TABLE.arrow_schema())


def _changed(lake: Lake, batch_id: int) -> list[tuple[int, str, str]]:
    feed = BatchScope(batch_id, (1,)).changed(SimpleNamespace(lake=lake), TABLE, ["id", "name", "_change_type"])
    assert feed is not None
    return sorted(zip(feed["id"].to_pylist(), feed["name"].to_pylist(), feed["_change_type"].to_pylist(), strict=True))


def test_a_micro_batch_sees_its_own_commits_whether_or_not_another_came_between(lake_dir):
    lake = Lake(lake_dir / "lake")
    lake.append(TABLE, _rows((1, "a"), (2, "b")), app_id="S/scoped", version=1)  # micro-batch 1
    lake.upsert(TABLE, _rows((2, "B"), (3, "c")), app_id="T/scoped", version=2)  # micro-batch 2, two commits in a row
    lake.upsert(TABLE, _rows((4, "d")), app_id="U/scoped", version=2)
    lake.upsert(TABLE, _rows((5, "e")), app_id="T/scoped", version=3)  # micro-batch 3, another's commit between
    lake.upsert(TABLE, _rows((6, "f")), app_id="X/scoped", version=4)  # (a later micro-batch's commit)
    lake.upsert(TABLE, _rows((1, "A")), app_id="U/scoped", version=3)

    assert _changed(lake, 1) == [(1, "a", "insert"), (2, "b", "insert")]
    assert _changed(lake, 2) == [
        (2, "B", "update_postimage"),
        (2, "b", "update_preimage"),
        (3, "c", "insert"),
        (4, "d", "insert"),
    ]
    assert _changed(lake, 3) == [(1, "A", "update_postimage"), (1, "a", "update_preimage"), (5, "e", "insert")]
    assert _changed(lake, 4) == [(6, "f", "insert")]
