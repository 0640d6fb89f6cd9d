"""The migrator: moves committed warehouse changes from Delta into PostgreSQL `dw.*`, exactly once.

For each warehouse table it reads the Delta change feed from the version after the last one recorded in
`streamdi.migration_ledger`, reduces it to the net change per key (last change wins, in commit order), and
hands all tables to `Warehouse.apply_changes`, which applies them and writes the ledger in ONE PostgreSQL
transaction: a batch becomes visible whole or not at all, and a crash anywhere leaves PostgreSQL at the
previous ledger state, from which a rerun continues.

Which Delta versions belong to a batch is read from the commits themselves: every streamdi commit carries
its app transaction version (the micro-batch id), so migrating "up to batch b" takes each table's commits
in order while they belong to batches <= b, whatever else has been committed since.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Table
from schemas.warehouse import WAREHOUSE_TABLES
from streamdi.faults import fault_point
from streamdi.lake import CommitInfo, Lake

log = logging.getLogger(__name__)


def target_version(history: list[CommitInfo], after: int, batch_id: int) -> int:
    """The highest table version v > `after` such that every commit in (after, v] belongs to a batch <= batch_id.

    Commits without an app transaction (table creation, maintenance) belong to no batch and never stop the
    scan. Returns `after` when there is nothing to migrate.
    """
    target = after
    for commit in history:
        if commit.table_version <= after:
            continue
        if commit.txn_version is not None and commit.txn_version > batch_id:
            break
        target = commit.table_version
    return target


def net_changes(changes: pa.Table, table: Table) -> tuple[pa.Table, pa.Table]:
    """Reduce a change feed to `(upserts, deletes)`: per key, the last change in commit order wins.

    Raises ValueError if one commit changed the same key twice (the feed would be ambiguous).
    """
    key = list(table.key)
    effective = changes.filter(pc.not_equal(changes["_change_type"], "update_preimage"))
    if effective.num_rows == 0:
        empty = table.arrow_schema().empty_table()
        return empty, empty.select(key)
    counted = effective.group_by([*key, "_commit_version"]).aggregate([("_change_type", "count")])
    if pc.max(counted["_change_type_count"]).as_py() > 1:
        raise ValueError(f"{table.qualified_name}: a commit changes the same key more than once")
    numbered = effective.append_column("_pos", pa.array(range(effective.num_rows), pa.int64()))
    ordered = numbered.sort_by([(c, "ascending") for c in key] + [("_commit_version", "ascending")])
    # "last" is an ordered aggregation: with one thread it takes the last row of each key in sorted order.
    last_pos = ordered.group_by(key, use_threads=False).aggregate([("_pos", "last")])["_pos_last"]
    last = numbered.filter(pc.is_in(numbered["_pos"], value_set=last_pos))
    is_delete = pc.equal(last["_change_type"], "delete")
    order = [(c, "ascending") for c in (table.order_by or table.key)]
    upserts = last.filter(pc.invert(is_delete)).select(table.column_names).sort_by(order)
    deletes = last.filter(is_delete).select(key).sort_by([(c, "ascending") for c in key])
    return upserts.cast(table.arrow_schema()), deletes


@dataclass(frozen=True)
class MigrationReport:
    batch_id: int
    tables: dict[str, int]  # rows applied per table (0 for tables already migrated)
    versions: dict[str, int]


def migrate_batch(
    lake: Lake, warehouse, batch_id: int, tables: tuple[Table, ...] = WAREHOUSE_TABLES
) -> MigrationReport:
    """Migrate every table's committed changes up to `batch_id` in one PostgreSQL transaction."""
    from streamdi.warehouse import TableChange

    changes = []
    versions: dict[str, int] = {}
    for table in tables:
        if not lake.exists(table):
            continue
        done = warehouse.last_migrated_version(table.name)
        after = done if done is not None else 0
        target = target_version(lake.history(table), after, batch_id)
        versions[table.name] = target
        if target <= after:
            continue
        upserts, deletes = net_changes(lake.changes(table, after + 1, target), table)
        changes.append(
            TableChange(table=table, delta_version=target, batch_id=batch_id, upserts=upserts, deletes=deletes)
        )
    fault_point("migrate.before_apply")
    applied = warehouse.apply_changes(changes) if changes else {}
    return MigrationReport(batch_id=batch_id, tables=applied, versions=versions)
