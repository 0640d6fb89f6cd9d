"""DimCustomer (part of step T2, CreateAccounts): its change records, its versions and the customer alerts.

Pure Arrow transforms on tables in the driver (`jobs.scd2_arrow`: a micro-batch's customers are far too few to
be worth Spark's planning); the T2 step (`jobs.create_accounts`) reads the staged
records, decides which customers to rebuild and commits. DimAccount (`jobs.accounts`) uses the change-record
contract declared here (`ORDER`, `SEQ`, `FILE`, `MICRO`, the status codes) and cuts its versions at the customer
versions this module builds.

Implements TPC-DI 1.1.0 clause 4.5 for DimCustomer, historical (CustomerMgmt.xml, Batch1) and incremental
(Customer.txt, Batch2..), plus the DimCustomer alerts of DImessages (3.2.18).

**DimCustomer** (SCD2 on the customer id, `jobs.scd2_arrow.build_versions`). A customer's change records are its
CustomerMgmt actions NEW, UPDCUST and INACT and its Customer.txt lines:
- NEW sets every field (an absent one is NULL); UPDCUST changes only the fields it carries (`present_fields`:
  present-but-empty sets NULL, absent keeps the old value); INACT changes only the status; a Customer.txt line
  (CDC_FLAG I or U) carries every field. A phone (`C_PHONE_n`) is one field: a record that carries any of its
  parts replaces the whole number (both generators always write the whole element); the tax ids are carried
  and looked up per version;
- status code: NEW/UPDCUST `ACTV`, INACT `INAC`, Customer.txt `C_ST_ID`; `status` is its `st_name` in the
  warehouse `statustype`;
- `gender`: `C_GNDR` in upper case if that is `M` or `F`, else `U` (also when absent);
- `phone1..3` from `C_CTRY_CODE`/`C_AREA_CODE`/`C_LOCAL`/`C_EXT`: country, area and local present ->
  `+ctry (area) local`; no country, area and local present -> `(area) local`; no area, local present ->
  `local`; otherwise NULL; a present extension is appended to a non-NULL number as it is;
- `email1`/`email2` = `C_PRIM_EMAIL`/`C_ALT_EMAIL` (Customer.txt `C_EMAIL_1`/`C_EMAIL_2`);
- `nationaltaxratedesc`/`nationaltaxrate` and `localtaxratedesc`/`localtaxrate`: `tx_name`/`tx_rate` of the
  warehouse `taxrate` row of `C_NAT_TX_ID`/`C_LCL_TX_ID` (NULL when the id is unknown);
- effective date: the day of ActionTS (XML) or the BatchDate of the line's TPC-DI batch (Customer.txt);
  one version per customer per day, the day's last change in declared order winning: TPC-DI batch, then
  ActionTS / BatchDate, then file position (`action_seq` / `CDC_DSN`), then the file name (a total order,
  so duplicated deliveries cannot make the pick depend on partitioning);
- `sk_customerid` = `surrogate_key(customerid, effectivedate)`.

**Alerts** (DImessages, source DimCustomer): "Invalid customer tier" (`C_ID = 1, C_TIER = 4`) and "DOB out of
range" (`C_ID = 1, C_DOB = 1905-09-03`), one per *new-customer record* -- a CustomerMgmt NEW action or a
Customer.txt line (CDC_FLAG I or U: each line carries the whole customer) -- whose tier is not 1, 2 or 3 (an absent
or empty C_TIER included) or whose birth date is before BatchDate minus 100 years or after BatchDate (BatchDate of
the record's TPC-DI batch). UPDCUST actions are not checked. Why: the specification states these checks among the
rules that build a customer's record from a full customer record (NEW, and every line of the incremental
Customer.txt); an UPDCUST carries only the fields it changes and inherits the rest, so it is not such a record.
That is also exactly what the official generator counts in C_TIER_INV, C_DOB_TO and C_DOB_TY. On official SF 3
data, Batch1's CustomerMgmt.xml has 243 NEW actions without a C_TIER attribute and 8 NEW actions with a tier
outside 1-3: 243 + 8 = 251 = C_TIER_INV; its 60 UPDCUST actions with an empty C_TIER and 1 with an invalid tier
are not counted (counting "records that carry the value", as this step once did, gave 8 + 60 + 1 = 69); Batch2's
one Customer.txt line with an empty C_TIER (a U line) is its C_TIER_INV of 1. Birth dates follow the same rule
(UPDCUST actions do not carry C_DOB in the official files). Message key: `tier C_ID=1 ACTION_SEQ=2` (XML) or
`tier C_ID=1 CDC_DSN=7` (Customer.txt); `dob ...` likewise.

A customer that lacks a required field or has an unknown status code in some version gets a `_problem`
(`first_problem`); the T2 step keeps such a customer out (see `jobs.create_accounts`).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import prospect
from jobs.arrow_ops import column, lookup
from jobs.messages import ALERT_COLUMNS, alert_table
from jobs.scd2 import BATCH, TS, present_flag
from jobs.scd2_arrow import build_versions, midnight, surrogate_keys
from schemas import warehouse as wh

SEQ = "_seq"  # position in the file: action_seq (XML) or CDC_DSN (incremental)
FILE = "_file"
MICRO = "_micro"  # micro-batch that staged the record
ORDER = (BATCH, TS, SEQ, FILE)
ACTIVE, INACTIVE = "ACTV", "INAC"

# Customer fields copied as they are: (field, CustomerMgmt.xml column, Customer.txt column).
CUSTOMER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("taxid", "c_tax_id", "c_tax_id"),
    ("lastname", "c_l_name", "c_l_name"),
    ("firstname", "c_f_name", "c_f_name"),
    ("middleinitial", "c_m_name", "c_m_name"),
    ("tier", "c_tier", "c_tier"),
    ("dob", "c_dob", "c_dob"),
    ("addressline1", "c_adline1", "c_adline1"),
    ("addressline2", "c_adline2", "c_adline2"),
    ("postalcode", "c_zipcode", "c_zipcode"),
    ("city", "c_city", "c_city"),
    ("stateprov", "c_state_prov", "c_state_prov"),
    ("country", "c_ctry", "c_ctry"),
    ("email1", "c_prim_email", "c_email_1"),
    ("email2", "c_alt_email", "c_email_2"),
    ("lcl_tx_id", "c_lcl_tx_id", "c_lcl_tx_id"),
    ("nat_tx_id", "c_nat_tx_id", "c_nat_tx_id"),
)
PHONE_PARTS = ("ctry", "area", "local", "ext")
CUSTOMER_VALUES = ("st_id", "gender", "phone1", "phone2", "phone3", *(f for f, _, _ in CUSTOMER_FIELDS))
REQUIRED_CUSTOMER = ("taxid", "lastname", "firstname", "dob", "addressline1", "postalcode", "city", "stateprov")
CUSTOMER_ACTIONS = ("NEW", "UPDCUST", "INACT")
STRING = pa.large_string()


# ------------------------------------------------------------------------------------------ field rules
def _text(*parts: pa.Array | str) -> pa.Array:
    """The parts joined; NULL where any part is NULL."""
    return pc.binary_join_element_wise(
        *[pa.scalar(p, STRING) if isinstance(p, str) else p for p in parts], pa.scalar("", STRING)
    )


def phone_number(ctry: pa.Array, area: pa.Array, local: pa.Array, ext: pa.Array) -> pa.Array:
    """The TPC-DI phone format: `+ctry (area) local`, `(area) local` or `local`, then the extension."""
    full = pc.and_(pc.and_(pc.is_valid(ctry), pc.is_valid(area)), pc.is_valid(local))
    local_area = pc.and_(pc.is_valid(area), pc.is_valid(local))
    number = pc.if_else(
        full,
        _text("+", ctry, " (", area, ") ", local),
        pc.if_else(local_area, _text("(", area, ") ", local), local),
    )
    return pc.if_else(pc.is_valid(ext), _text(number, ext), number)


def gender(code: pa.Array) -> pa.Array:
    """`M` or `F` (in any case, around spaces) in upper case; anything else, NULL included, is `U`."""
    upper = pc.utf8_upper(pc.utf8_trim(code, " "))
    return pc.if_else(pc.fill_null(pc.is_in(upper, value_set=pa.array(["M", "F"], STRING)), False), upper, "U")


def present(present_fields: pa.Array, name: str) -> pa.Array:
    """Per CustomerMgmt action: whether its comma-separated `present_fields` lists `name` (NULL when not known)."""
    return pc.match_substring_regex(present_fields, f"(^|,){name}(,|$)")


def lineage(records: pa.Table, *, xml: bool) -> dict[str, pa.Array]:
    """The order and lineage columns of the change-record contract (`ORDER` and `MICRO`) of staged CustomerMgmt
    actions (`xml`: ActionTS, action_seq) or of dated incremental lines (midnight of the BatchDate, CDC_DSN)."""
    return {
        BATCH: column(records, "source_batch"),
        TS: column(records, "action_ts") if xml else midnight(column(records, "batchdate")),
        SEQ: column(records, "action_seq" if xml else "cdc_dsn"),
        FILE: column(records, "source_file"),
        MICRO: column(records, "batch_id"),
    }


def _flag(values: pa.Array | bool, n: int) -> pa.Array:
    return pa.array(np.full(n, values), pa.bool_()) if isinstance(values, bool) else values


# ------------------------------------------------------------------------------------------ change records
def customer_changes(actions: pa.Table, lines: pa.Table) -> pa.Table:
    """One change record per customer action (NEW/UPDCUST/INACT) of `actions` (staged CustomerMgmt rows) and
    per line of `lines` (staged Customer.txt rows with their `batchdate`), in the `build_versions` contract:
    `customerid`, `_batch`, `_ts`, `_seq`, `_file`, `_micro`, the `CUSTOMER_VALUES` and their `_has_` flags."""
    xml = actions.filter(pc.is_in(actions["action_type"], value_set=pa.array(CUSTOMER_ACTIONS, STRING)))
    kind = column(xml, "action_type")
    new, upd = pc.equal(kind, "NEW"), pc.equal(kind, "UPDCUST")
    fields = column(xml, "present_fields")

    def carried(parts: tuple[str, ...]) -> pa.Array:
        updated = present(fields, parts[0])
        for part in parts[1:]:
            updated = pc.or_kleene(updated, present(fields, part))
        return pc.if_else(new, True, pc.if_else(upd, updated, False))

    def values(table: pa.Table, xml_side: bool) -> dict[str, pa.Array]:
        out = {f: column(table, x if xml_side else c) for f, x, c in CUSTOMER_FIELDS}
        out["gender"] = gender(column(table, "c_gndr"))
        for n in (1, 2, 3):
            out[f"phone{n}"] = phone_number(*(column(table, f"c_{p}_{n}") for p in PHONE_PARTS))
        return out

    status = pc.if_else(pc.equal(kind, "INACT"), INACTIVE, ACTIVE).cast(STRING)
    from_xml = {
        "customerid": column(xml, "c_id"),
        **lineage(xml, xml=True),
        "st_id": status,
        **values(xml, True),
    }
    from_xml[present_flag("st_id")] = _flag(True, xml.num_rows)
    xml_parts = {f: (x,) for f, x, _ in CUSTOMER_FIELDS} | {"gender": ("c_gndr",)}
    xml_parts |= {f"phone{n}": tuple(f"c_{p}_{n}" for p in PHONE_PARTS) for n in (1, 2, 3)}
    for f, parts in xml_parts.items():
        from_xml[present_flag(f)] = carried(parts)
    m = lines.num_rows
    from_lines = {
        "customerid": column(lines, "c_id"),
        **lineage(lines, xml=False),
        "st_id": column(lines, "c_st_id"),
        **values(lines, False),
    }
    for name in list(from_xml):
        if name.startswith("_has_"):
            from_lines[name] = _flag(True, m)
    first = pa.table(from_xml)
    return pa.concat_tables([first, pa.table(from_lines).select(first.column_names).cast(first.schema)])


# ------------------------------------------------------------------------------------------ versions
def first_problem(n: int, *checks: tuple[pa.Array, list[str] | str]) -> pa.Array:
    """The first failing check's reason per row (each check is `(failed, reason)`, the reason one text or one per
    row), NULL where all pass."""
    out: list[str | None] = [None] * n
    for failed, reason in checks:
        for i in np.flatnonzero(np.asarray(pc.fill_null(failed, False), dtype=bool)):
            if out[i] is None:
                out[i] = reason if isinstance(reason, str) else reason[i]
    return pa.array(out, STRING)


def customer_versions(changes: pa.Table, status_types: pa.Table, tax_rates: pa.Table) -> pa.Table:
    """DimCustomer versions of every customer in `changes`, plus `st_id` (the status code) and `_problem`
    (why the version cannot be loaded; NULL when it can)."""
    v = build_versions(changes, "customerid", ORDER, CUSTOMER_VALUES)
    n = v.num_rows
    st_id = column(v, "st_id")
    status = lookup(st_id, status_types, "st_id", "st_name")
    codes = pc.fill_null(st_id, "").to_pylist()
    problem = first_problem(
        n,
        (pc.is_null(status), [f"unknown status code '{c}'" for c in codes]),
        *[(pc.is_null(v[c]), f"missing {c}") for c in REQUIRED_CUSTOMER],
    )
    schema = wh.DIM_CUSTOMER.arrow_schema()
    out = {"sk_customerid": surrogate_keys(v["customerid"], v["effectivedate"])}
    for name in schema.names[1:]:
        if name == "status":
            out[name] = status
        elif name in ("nationaltaxratedesc", "localtaxratedesc", "nationaltaxrate", "localtaxrate"):
            ids = column(v, "nat_tx_id" if name.startswith("national") else "lcl_tx_id")
            out[name] = lookup(ids, tax_rates, "tx_id", "tx_name" if name.endswith("desc") else "tx_rate")
        elif name in prospect.DEMOGRAPHICS:
            # from Prospect.csv lines, once the versions are collected (`jobs.prospect.with_demographics`)
            out[name] = pa.nulls(n, schema.field(name).type)
        else:
            out[name] = column(v, name)
    out["st_id"] = st_id
    out["_problem"] = problem
    return pa.table(out)


# ------------------------------------------------------------------------------------------ alerts
def hundred_years_before(day: dt.date) -> dt.date:
    """`day` 1,200 months earlier (29 February becomes the 28th when that year has none), as Spark's add_months."""
    try:
        return day.replace(year=day.year - 100)
    except ValueError:
        return day.replace(year=day.year - 100, day=28)


def _suspects(records: pa.Table) -> list[dict]:
    """The records that may raise an alert (a superset, checked exactly in Python): a tier other than 1, 2 or 3, or a
    birth date after the BatchDate or more than 36,500 days (less than 100 years) before it."""
    tier_bad = pc.invert(pc.fill_null(pc.is_in(records["c_tier"], value_set=pa.array([1, 2, 3], pa.int32())), False))
    born = pc.cast(records["c_dob"], pa.int32())
    dated = pc.cast(records["batchdate"], pa.int32())
    dob_bad = pc.or_(pc.greater(born, dated), pc.less(born, pc.subtract(dated, 36_500)))
    return records.filter(pc.or_(tier_bad, pc.fill_null(dob_bad, False))).to_pylist()


def customer_alerts(actions: pa.Table, lines: pa.Table) -> pa.Table:
    """Tier and birth-date alerts of the records given: CustomerMgmt rows and Customer.txt rows, each with the
    `batchdate` of its TPC-DI batch. One alert per new-customer record (a NEW action or a Customer.txt line) whose
    tier is not 1, 2 or 3 (absent or empty included) or whose birth date is out of range (see module doc)."""
    xml = actions.filter(pc.equal(actions["action_type"], "NEW"))
    records = [
        (row, f"ACTION_SEQ={row['action_seq']}")
        for row in _suspects(xml.select(["c_id", "c_tier", "c_dob", "action_seq", "source_batch", "batchdate"]))
    ] + [
        (row, f"CDC_DSN={row['cdc_dsn']}")
        for row in _suspects(lines.select(["c_id", "c_tier", "c_dob", "cdc_dsn", "source_batch", "batchdate"]))
    ]
    tier: list[tuple] = []
    dob: list[tuple] = []
    for row, position in records:
        ident = f"C_ID={row['c_id']} {position}"
        cid = f"C_ID = {row['c_id']}"
        if row["c_tier"] not in (1, 2, 3):
            shown = "" if row["c_tier"] is None else row["c_tier"]
            tier.append((row["source_batch"], f"{cid}, C_TIER = {shown}", f"tier {ident}"))
        born, dated = row["c_dob"], row["batchdate"]
        if born is not None and dated is not None and (born < hundred_years_before(dated) or born > dated):
            dob.append((row["source_batch"], f"{cid}, C_DOB = {born.isoformat()}", f"dob {ident}"))
    return pa.concat_tables(
        [
            alert_table("DimCustomer", "Invalid customer tier", tier),
            alert_table("DimCustomer", "DOB out of range", dob),
        ]
    ).cast(ALERT_COLUMNS)
