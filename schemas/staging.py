"""Staging tables: each source's fields plus lineage, and the rejects table for lines that do not parse.

Lineage columns:
- `batch_id`: the micro-batch (batch log sequence number) that staged the line; orders and deduplicates work,
  never copied into warehouse rows.
- `source_batch`: the TPC-DI batch (1 historical, 2.. incremental) the file belongs to.
- `source_file`: the landing file's path relative to the landing zone.
- `line_no`: 1-based line number in that file.

The two non-delimited sources have their own staging tables, declared here from their layouts:
`staging.finwire_cmp`, `staging.finwire_sec`, `staging.finwire_fin` (one per FINWIRE record type, fields from
`schemas.finwire`) and `staging.customermgmt` (one row per `TPCDI:Action` of CustomerMgmt.xml, fields from
`schemas.sources.CUSTOMER_MGMT_XML`; `action_seq`, the action's 1-based position in the file, takes the place
of `line_no`).
"""

from __future__ import annotations

from schemas import finwire as fw
from schemas.model import LINEAGE, Column, Table
from schemas.sources import ACTION_TS, CUSTOMER_MGMT_ACTION, CUSTOMER_MGMT_XML, DATE, XmlField

REJECTS = Table(
    name="rejects",
    layer="staging",
    columns=(
        Column("batch_id", "bigint", False),
        Column("source_batch", "int", False),
        Column("source", "string", False, "declared source name, e.g. TradeType"),
        Column("source_file", "string", False),
        Column("line_no", "bigint", False),
        Column("line", "string", True, "the raw line as read"),
        Column("reason", "string", False, "why the line was rejected"),
    ),
    order_by=("batch_id", "source_file", "line_no"),
    doc="Every line that could not be parsed, with the reason; read = staged + rejected.",
)


def _finwire_table(record: fw.FixedWidthRecord) -> Table:
    return Table(
        name=f"finwire_{record.rec_type.lower()}",
        layer="staging",
        columns=(*record.columns, *LINEAGE),
        order_by=("batch_id", "source_file", "line_no"),
        doc=f"Parsed {record.rec_type} records of the FINWIRE files.",
    )


FINWIRE_TABLES: dict[str, Table] = {code: _finwire_table(record) for code, record in fw.RECORDS.items()}

_XML_FORMATS = {"date": DATE, "timestamp": ACTION_TS}
_XML_REQUIRED = {"action_type", "action_ts", "c_id"}


def _xml_column(f: XmlField) -> Column:
    return Column(f.name, f.type, f.name not in _XML_REQUIRED, f"CustomerMgmt.xml {f.path}", _XML_FORMATS.get(f.type))


CUSTOMER_MGMT = Table(
    name="customermgmt",
    layer="staging",
    columns=(
        *(_xml_column(f) for f in (*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML)),
        Column(
            "present_fields",
            "string",
            False,
            "comma-separated names of the customer/account columns whose element or attribute the action carries "
            "(empty ones included): tells an absent field (unchanged by UPDCUST/UPDACCT) from one set to NULL",
        ),
        *LINEAGE[:3],
        Column("action_seq", "bigint", False, "1-based position of the action in the file"),
    ),
    order_by=("batch_id", "source_file", "action_seq"),
    doc="One row per TPCDI:Action of CustomerMgmt.xml, customer and account fields flattened.",
)
