"""Ordering contracts: how each source's records are ordered, declared once.

See docs/stream.md, "Parts, channels and ordering contracts".

A source's contract says what order its records carry and hence which reorderings of its deliveries change
nothing. The collector and the stage check arriving data against it (`jobs.ordering`); the transforms rely only on
it: every order-dependent rule sorts by the declared key explicitly, so contract-allowed reorderings of the
deliveries give an identical warehouse.

- `total` (`key`, within a TPC-DI batch): every record of the source in a TPC-DI batch has a distinct key, and the
  records come in increasing key order through the batch's file, across its parts in part order. The official
  generator's CDC files (Batch2.. `Customer.txt`, `Account.txt`, `Trade.txt`, ...) are totally ordered by CDC_DSN
  within a file; the sequence does not continue across batches (Batch3's Trade.txt starts below Batch2's last DSN),
  so the order holds within a TPC-DI batch only. A part may arrive before its predecessor (the part before it in
  part order); once both are there, a key of the later part that is not above every key of the earlier part is a
  **violation**: the batch halts and says where (never silently applied).
- `bag`: no order between the source's records within a TPC-DI batch (Prospect.csv is a snapshot, BatchDate.txt one
  line, the historical Batch1 files are loaded whole); any reordering of its parts is allowed.

Parts are the pieces of one source file of one TPC-DI batch delivered as separate landing files, named
`<Source>_batch<K>_<NNNN>.<ext>` (the drip generator's names; `jobs.ordering.part_of`). Part NNNN's predecessor is
part NNNN-1 of the same source, TPC-DI batch and landing directory (a channel); part 0 has none. A part staged while
its predecessor has not arrived is a **missing part**: the stage records a `predecessor_present` check with the
policy of `STREAMDI_MISSING_PART_POLICY` (`warn`: go on and say so, in `quality.results` and DImessages; `halt`:
stop the batch until the part arrives or an operator resumes it). The stream service first holds such a part back
for `STREAMDI_MISSING_PART_GRACE` seconds, waiting for its predecessor (`streamdi.run.stream_cuts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import sources as src


@dataclass(frozen=True)
class Ordering:
    kind: str  # "total" or "bag"
    key: str | None = None  # the order key column of a total order
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("total", "bag") or (self.kind == "total") != (self.key is not None):
            raise ValueError(f"an ordering is total (with a key) or a bag (without), got {self}")


BY_CDC_DSN = Ordering("total", "cdc_dsn", "CDC_DSN increases through the TPC-DI batch's file, across its parts")
BAG = Ordering("bag", doc="no order within the TPC-DI batch")

CONTRACTS: dict[str, Ordering] = {
    **{source.name: BAG for source in src.HISTORICAL_SOURCES},
    **{source.name: BY_CDC_DSN for source in src.INCREMENTAL_SOURCES if source.columns[0].name == "cdc_flag"},
    src.PROSPECT.name: BAG,
    src.BATCH_DATE.name: BAG,
}


def contract_for(source_name: str) -> Ordering:
    """The declared ordering of a source (every delimited source has one)."""
    try:
        return CONTRACTS[source_name]
    except KeyError:
        raise KeyError(f"source {source_name!r} declares no ordering contract (schemas/ordering.py)") from None
