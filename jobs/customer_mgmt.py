"""Parse CustomerMgmt.xml (Batch1) into typed actions: read by Spark's XML reader, typed in Arrow.

Spark's XML reader reads the `TPCDI:Action` elements with a declared schema (every value as text, surrounding
spaces kept, no inference); `raw_actions` flattens each action to one text column per declared field
(`schemas.sources.CUSTOMER_MGMT_ACTION` and `CUSTOMER_MGMT_XML`), and `check_actions` types them with the rules of
every other source (`jobs.fields`). An element or attribute that is present but empty (or blank) gives NULL,
like an absent one; `present_fields` lists the fields present, so UPDCUST/UPDACCT can tell "unchanged" from "set
to NULL". An action without C_ID, with a bad ActionTS or ActionType, a value not of its type, more than one
Account, or XML the reader cannot parse is rejected (`line` holds the action as JSON, or the unreadable text).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from jobs import fields
from schemas.sources import CUSTOMER_MGMT_ACTION, CUSTOMER_MGMT_ACTIONS, CUSTOMER_MGMT_ROW_TAG, CUSTOMER_MGMT_XML
from schemas.staging import CUSTOMER_MGMT

_ACCOUNT = "Account"  # read as an array, so that an action with several accounts is seen (and rejected)
_FIELDS = (*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML)


def read_schema() -> T.StructType:
    """The schema the XML reader is given (no inference): every declared path as text, nested as in the file,
    plus `_corrupt_record` for an action the reader cannot parse."""
    tree: dict = {}
    for f in _FIELDS:
        node = tree
        *parents, leaf = [p.replace("@", "_", 1) for p in f.path.split("/")]
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = None

    def struct(node: dict) -> T.StructType:
        members = []
        for k, v in node.items():
            kind = T.StringType() if v is None else struct(v)
            members.append(T.StructField(k, T.ArrayType(kind) if k == _ACCOUNT else kind, True))
        return T.StructType(members)

    return struct(tree).add(T.StructField("_corrupt_record", T.StringType(), True))


def read_actions(spark: SparkSession, path: str) -> DataFrame:
    """The `TPCDI:Action` elements of one CustomerMgmt.xml file: `action_seq` (1-based position in the file),
    `action` (the raw values, see `read_schema`).

    Spark's XML reader keeps the namespace prefix in tag names, so the row tag is matched as written. The
    position is counted in the JVM (no Python round trip): the reader returns a split's actions in file order (it
    reads an XML file as one split), so (split start offset, row counter within the task) orders them as in the
    file whatever the partitioning, and `row_number` over that order numbers them. The counter
    (`monotonically_increasing_id`) only orders the rows of one read here; it is never stored or used as a key.
    """
    schema = read_schema()
    raw = (
        spark.read.format("xml")
        .option("rowTag", CUSTOMER_MGMT_ROW_TAG)
        .option("ignoreSurroundingSpaces", "false")  # keep text exactly as written (e.g. a leading space)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .schema(schema)
        .load(path)
    )
    located = raw.select(
        F.input_file_block_start().alias("_split"),
        F.monotonically_increasing_id().alias("_in_task"),
        F.struct(*[F.col(f.name) for f in schema.fields]).alias("action"),
    )
    in_file_order = Window.orderBy("_split", "_in_task")
    return located.select(F.row_number().over(in_file_order).cast("long").alias("action_seq"), "action")


def raw_actions(actions: DataFrame) -> DataFrame:
    """Actions as read (`action_seq`, `action`, lineage columns) flattened: `action_seq`, the lineage columns, one
    text column per declared field (NULL when absent), `_accounts` (Account elements, -1 for none), `_corrupt`
    (the text the reader could not parse, else NULL) and `_as_read` (the action as JSON, or that text)."""
    passthrough = [c for c in actions.columns if c not in ("action_seq", "action")]
    corrupt = F.col("action._corrupt_record")
    return actions.select(
        "action_seq",
        *passthrough,
        *[_xml_value(f.path).alias(f.name) for f in _FIELDS],
        F.size(F.col("action.Customer.Account")).alias("_accounts"),
        corrupt.alias("_corrupt"),
        F.coalesce(corrupt, F.to_json(F.col("action").dropFields("_corrupt_record"))).alias("_as_read"),
    )


def check_actions(raw: pa.Table) -> pa.Table:
    """Type `raw_actions` rows: the columns of `staging.customermgmt` without lineage (the declared fields,
    `present_fields`, `action_seq`), the lineage columns, `line` (the action as read, for a rejected one; NULL
    for a good one) and `reason` ('' for a good action)."""
    own = {"action_seq", "_accounts", "_corrupt", "_as_read", *(f.name for f in _FIELDS)}
    passthrough = [c for c in raw.column_names if c not in own]
    problems, typed, present_names = fields.Problems(raw.num_rows), {}, []
    for f in _FIELDS:
        text = raw[f.name].combine_chunks().cast(pa.large_string())
        filled = pc.fill_null(text, "")
        present = pc.not_equal(pc.utf8_trim(filled, characters=" "), "")
        typed[f.name] = fields.type_column(problems, filled, present, CUSTOMER_MGMT.column(f.name))
        if f is CUSTOMER_MGMT_ACTION[0]:  # the action type's own check: one of the known types
            unknown = pc.and_(pc.is_valid(text), pc.invert(pc.is_in(text, pa.array(CUSTOMER_MGMT_ACTIONS))))
            known = ", ".join(CUSTOMER_MGMT_ACTIONS)
            problems.add(unknown, fields.join("action_type: '", filled, f"' is not one of {known}"))
        if f in CUSTOMER_MGMT_XML:
            present_names.append(pc.if_else(pc.is_valid(text), pa.scalar(f",{f.name}", pa.large_string()), ""))
    accounts = raw["_accounts"].combine_chunks()
    problems.add(
        pc.greater(pc.fill_null(accounts, -1), 1),
        fields.join(accounts.cast(pa.string()), " Account elements, at most one expected"),
    )
    corrupt = pc.is_valid(raw["_corrupt"].combine_chunks())
    reason = pc.if_else(
        corrupt,
        pa.scalar("malformed XML: the reader could not parse this action", pa.large_string()),
        problems.reason(),
    )
    present_fields = pc.utf8_slice_codeunits(fields.join(*present_names), 1)
    as_read = raw["_as_read"].combine_chunks().cast(pa.large_string())
    out = pa.table(typed)
    out = out.append_column("present_fields", present_fields).append_column("action_seq", raw["action_seq"])
    for name in passthrough:
        out = out.append_column(name, raw[name])
    line = pc.if_else(pc.equal(reason, ""), pa.scalar(None, pa.large_string()), as_read)
    return out.append_column("line", line).append_column("reason", reason)


def _xml_value(path: str) -> Column:
    """The column Spark's XML reader gives an element path (`@NAME` = attribute, read as `_NAME`)."""
    value = F.col("action")
    for part in path.split("/"):
        value = value.getField(part.replace("@", "_", 1))
        if part == _ACCOUNT:
            value = F.get(value, 0)
    return value
