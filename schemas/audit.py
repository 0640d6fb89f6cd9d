"""Audit figures: the expected counts the TPC-DI generator writes next to the data (`*_audit.csv`).

Every audit file has the header `DataSet, BatchID ,Date , Attribute , Value, DValue` (the official generator
puts spaces around the names) and one figure per line, e.g. `DimCustomer,2,,C_NEW,11,` (expected count) or
`Batch,2,2017-07-08,FirstDay,,` (a date). Empty fields are NULL. A `Value` of -1 means the generator did not
count that figure.

`FIGURE_FIELDS` declares the six fields, which `jobs.audit_figures` types with the one field implementation
(`jobs.fields`) like any source file: a `BatchID` or `Value` is an integer, a `Date` is `yyyy-MM-dd`, a `DValue`
a number (`double`: a decimal, maybe with an exponent).

`staging.audit_figures` keeps the figures of every audit file that landed, with the staging lineage
(`batch_id` micro-batch, `source_batch`, `source_file`, `line_no`); `jobs.audit_figures` parses and stages
them, `jobs.audit` checks the warehouse against them.
"""

from __future__ import annotations

from schemas.model import Column as C
from schemas.model import Table
from schemas.staging import LINEAGE

# The six fields of an audit line, in file order, as the header names them (compared without spaces and case).
FIELD_NAMES = ("DataSet", "BatchID", "Date", "Attribute", "Value", "DValue")
# The six fields declared, in file order.
FIGURE_FIELDS = (
    C("dataset", "string", False, "DataSet: the table (or Batch, Generator) the figure is about"),
    C("batchid", "int", False, "BatchID: TPC-DI batch of the figure"),
    C("date", "date", doc="Date: a day (Batch FirstDay/LastDay, generator dates); NULL for counts", fmt="yyyy-MM-dd"),
    C("attribute", "string", False, "Attribute: the figure's name, e.g. C_NEW"),
    C("value", "bigint", doc="Value: the count; -1 when the generator did not count it"),
    C("dvalue", "double", doc="DValue: a decimal figure (generator parameters)"),
)

# A parsed audit file, before staging: the fields plus the file and line they come from.
PARSED_FIGURE_COLUMNS = (*FIGURE_FIELDS, LINEAGE[2], LINEAGE[3])

AUDIT_FIGURES = Table(
    name="audit_figures",
    layer="staging",
    columns=(*FIGURE_FIELDS, *LINEAGE),
    order_by=("batch_id", "source_file", "line_no"),
    doc="Figures of every landed *_audit.csv file (expected counts for the audit); never warehouse data.",
)

NOT_COUNTED = -1  # a Value the generator marks as not counted
