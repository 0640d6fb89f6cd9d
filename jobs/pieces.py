"""A fact recomputed a piece of its keys at a time: what FactWatches (customers), FactHoldings (trades) and
FactCashBalances (accounts) share.

Each of these steps recomputes every row of the keys a micro-batch touched, and a row depends only on its key's own
records (and the dimension versions they name), so the keys can be taken in pieces, in ascending order, each piece
read and recomputed alone: the records held are bounded by the piece, not by the load (SF 100's first load holds
~13 M trades and ~21 M watch records). The step's table is still committed once per micro-batch:
- a first load of several pieces (the table empty, nothing committed for this micro-batch) writes each piece's rows
  as a file of its own as it goes and commits them at once (`Lake.pieces`): the table is never whole in memory;
- otherwise the pieces' upserts and deletes are gathered and committed as one MERGE, as one piece would be.
Then the step's alerts about those keys are committed, built from what each piece found (the records that could not
be loaded), in key order.

With one piece (every incremental micro-batch of a TPC-DI load, and small first loads) this is the step as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from jobs.messages import commit_alert_changes
from jobs.scope import BatchScope
from schemas import warehouse as wh
from schemas.model import Table
from streamdi.context import JobContext

T = TypeVar("T")


@dataclass(frozen=True)
class Piece(Generic[T]):
    """What recomputing one piece of keys gave: the rows to upsert, the keys of stored rows to delete (none when
    the piece's rows were not compared with the stored ones), and the rest (`found`: whatever the step needs for
    its alerts)."""

    upserts: pa.Table
    deletes: pa.Table | None
    found: T


@dataclass(frozen=True)
class Alerts(Generic[T]):
    """The step's alerts about its keys (`jobs.messages.commit_alert_changes`): raised by `source` with one of
    `texts`, owned by `<owner>=<key>`, built from every piece's `found` (in key order) by `of`."""

    source: str
    texts: tuple[str, ...]
    owner: str
    of: Callable[[list[T]], pa.Table]


def recompute_in_pieces(
    ctx: JobContext,
    scope: BatchScope,
    step: str,
    table: Table,
    keys: pa.Array,
    per_piece: int,
    recompute: Callable[[pa.Array, bool], Piece[T]],
    alerts: Alerts[T],
) -> tuple[dict[str, int], list[T]]:
    """Recompute `keys` (int64, not empty) of `table` `per_piece` at a time in ascending order, commit the rows once
    as `<step>/<table>` of this micro-batch (skipped when committed before), then the alerts. `recompute(piece_keys,
    compare)` gives a piece's rows; with `compare` it also lists the stored rows of those keys that no longer exist
    (`deletes`), without it (a first load written in pieces, or a table committed before) it need not read the
    table. Returns the rows written per table (upserts and deletes) and every piece's `found`."""
    keys = pc.take(keys, pc.array_sort_indices(keys))
    done = scope.committed(ctx, step, table)
    app_id = scope.app_id(step, table)
    in_files = None
    if not done and len(keys) > per_piece and ctx.lake.is_empty(table):
        in_files = ctx.lake.pieces(table, app_id=app_id, version=scope.batch_id)
    upserts: list[pa.Table] = []
    deletes: list[pa.Table] = []
    found: list[T] = []
    for start in range(0, len(keys), per_piece):
        piece = recompute(keys[start : start + per_piece], not done and in_files is None)
        found.append(piece.found)
        if in_files is not None:
            in_files.add(piece.upserts)
        elif not done:
            upserts.append(piece.upserts)
            if piece.deletes is not None:
                deletes.append(piece.deletes)
        del piece  # let its rows go before the next piece is computed
    out: dict[str, int] = {}
    if in_files is not None:
        out[table.name] = in_files.commit().rows
    elif not done:
        rows = pa.concat_tables(upserts)
        gone = pa.concat_tables(deletes) if deletes else None
        ctx.lake.upsert(table, rows, app_id=app_id, version=scope.batch_id, deletes=gone)
        out[table.name] = rows.num_rows + (0 if gone is None else gone.num_rows)
    owners = [f"{alerts.owner}={k}" for k in keys.to_pylist()]
    raised = alerts.of(found)
    written = commit_alert_changes(
        ctx, scope, step, table.name, raised, source=alerts.source, texts=alerts.texts, owners=owners
    )
    if written:
        out[wh.DI_MESSAGES.name] = written
    return out, found
