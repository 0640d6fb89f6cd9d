"""DimAccount (part of step T2, CreateAccounts): its change records and its versions, cut at the customer versions.

Pure Arrow transforms on tables in the driver (as `jobs.customers`); the T2 step (`jobs.create_accounts`) reads
the staged records, decides which accounts to rebuild and commits. The change records follow the contract of
DimCustomer's (`jobs.customers`: declared order, file position, micro-batch), and the versions are cut at the
DimCustomer versions that `jobs.customers.customer_versions` builds.

Implements TPC-DI 1.1.0 clause 4.5 for DimAccount, historical (CustomerMgmt.xml, Batch1) and incremental
(Account.txt, Batch2..).

**DimAccount** (SCD2 on the account id). An account's change records are the CustomerMgmt actions NEW (its
account), ADDACCT, UPDACCT, CLOSEACCT and its Account.txt lines: NEW/ADDACCT set every field (status `ACTV`),
UPDACCT changes the fields it carries (status `ACTV`), CLOSEACCT changes only the status (`INAC`), an
Account.txt line carries every field (status `CA_ST_ID`). The account's customer is the enclosing `C_ID` (XML)
or `CA_C_ID`; `accountdesc` = `CA_NAME`, `taxstatus` = `CA_TAX_ST`. The account's own history is then **cut at
every version of its customer**: each account version is the intersection of an account-record version and a
customer version, so a new customer version (UPDCUST, INACT, a Customer.txt line) gives each of the
customer's accounts a new version the same day that points to the new `sk_customerid`, and every account
version lies inside the customer version it points to (the audit's SK_CustomerID rule). Accounts already
closed are cut too: "the customer's accounts open at that time" is read as the accounts that exist then,
since a closed account's open-ended version must not outlive the customer version it points to. While the
customer's status is `INAC` the account's status is `INAC` too (INACT inactivates the customer's accounts;
the audit requires an inactive account row for every inactive customer version).
`sk_brokerid` is the DimBroker row of `CA_B_ID` valid on the account version's effective date. `batchid` is
the TPC-DI batch of the change that started the version (the account's or the customer's; the later-starting
one, the greater batch on a tie). `sk_accountid` = `surrogate_key(accountid, effectivedate)`.

An account version whose customer, broker or status cannot be resolved gets a `_problem` (`first_problem`); the
T2 step keeps such an account out (see `jobs.create_accounts`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops
from jobs.arrow_ops import column, lookup, sort
from jobs.customers import ACTIVE, INACTIVE, ORDER, STRING, first_problem, lineage, present
from jobs.scd2 import END_OF_TIME, present_flag
from jobs.scd2_arrow import build_versions, surrogate_keys
from jobs.valid_at import take, valid_versions

# Account change-record fields: (field, CustomerMgmt.xml column, Account.txt column).
ACCOUNT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("brokerid", "ca_b_id", "ca_b_id"),
    ("accountdesc", "ca_name", "ca_name"),
    ("taxstatus", "ca_tax_st", "ca_tax_st"),
)
ACCOUNT_VALUES = ("customerid", "st_id", *(f for f, _, _ in ACCOUNT_FIELDS))
ACCOUNT_ACTIONS = ("NEW", "ADDACCT", "UPDACCT", "CLOSEACCT")


def account_changes(actions: pa.Table, lines: pa.Table) -> pa.Table:
    """One change record per account action (NEW with an account, ADDACCT, UPDACCT, CLOSEACCT) of `actions`
    and per line of `lines` (staged Account.txt rows with their `batchdate`): `accountid`, the order columns,
    `_micro`, the `ACCOUNT_VALUES` and their `_has_` flags."""
    kinds = pc.is_in(actions["action_type"], value_set=pa.array(ACCOUNT_ACTIONS, STRING))
    xml = actions.filter(pc.and_(kinds, pc.is_valid(actions["ca_id"])))
    kind = column(xml, "action_type")
    whole = pc.is_in(kind, value_set=pa.array(["NEW", "ADDACCT"], STRING))
    upd = pc.equal(kind, "UPDACCT")
    n, m = xml.num_rows, lines.num_rows
    yes = pa.array(np.ones(n, bool))
    from_xml = {
        "accountid": column(xml, "ca_id"),
        **lineage(xml, xml=True),
        "customerid": column(xml, "c_id"),
        present_flag("customerid"): yes,
        "st_id": pc.if_else(pc.equal(kind, "CLOSEACCT"), INACTIVE, ACTIVE).cast(STRING),
        present_flag("st_id"): yes,
        **{f: column(xml, x) for f, x, _ in ACCOUNT_FIELDS},
        **{
            present_flag(f): pc.if_else(whole, True, pc.if_else(upd, present(column(xml, "present_fields"), x), False))
            for f, x, _ in ACCOUNT_FIELDS
        },
    }
    every = pa.array(np.ones(m, bool))
    from_lines = {
        "accountid": column(lines, "ca_id"),
        **lineage(lines, xml=False),
        "customerid": column(lines, "ca_c_id"),
        present_flag("customerid"): every,
        "st_id": column(lines, "ca_st_id"),
        present_flag("st_id"): every,
        **{f: column(lines, c) for f, _, c in ACCOUNT_FIELDS},
        **{present_flag(f): every for f, _, _ in ACCOUNT_FIELDS},
    }
    first = pa.table(from_xml)
    return pa.concat_tables([first, pa.table(from_lines).select(first.column_names).cast(first.schema)])


# ------------------------------------------------------------------------------------------ versions
def _overlapping(accounts: pa.Table, customers: pa.Table) -> pa.Table:
    """Every (account version, customer version) pair of the same customer whose periods overlap: the account
    version's row number `_row` and the customer version's columns."""
    pairs = accounts.select(["_row", "customerid", "_a_eff", "_a_end"]).join(
        customers, "customerid", "_c_id", join_type="inner"
    )
    overlap = pc.and_(pc.less(pairs["_c_eff"], pairs["_a_end"]), pc.less(pairs["_a_eff"], pairs["_c_end"]))
    return pairs.filter(overlap)


def _dated(values: pa.Array, days: pa.Array) -> list[str]:
    """`value on yyyy-mm-dd` texts of the problem messages (Spark's `%s` of a NULL is `null`)."""
    shown = pc.fill_null(values.cast(STRING), "null").to_pylist()
    return [f"{v} on {d}" for v, d in zip(shown, days.cast(STRING).to_pylist(), strict=True)]


def account_versions(changes: pa.Table, customers: pa.Table, brokers: pa.Table, status_types: pa.Table) -> pa.Table:
    """DimAccount versions of every account in `changes`: the account-record versions cut at the versions of
    their customer (`customers`: loadable DimCustomer versions with `st_id`), with `sk_brokerid` from
    `brokers` (DimBroker) and the status name from `status_types`; plus `customerid`, `brokerid` and
    `_problem` (why the version cannot be loaded; NULL when it can)."""
    base = build_versions(changes, "accountid", ORDER, ACCOUNT_VALUES)
    base = pa.table(
        {
            "_row": pa.array(np.arange(base.num_rows), pa.int64()),
            "accountid": base["accountid"],
            "customerid": base["customerid"],
            "brokerid": base["brokerid"],
            "accountdesc": base["accountdesc"],
            "taxstatus": base["taxstatus"],
            "_a_st": base["st_id"],
            "_a_eff": base["effectivedate"],
            "_a_end": base["enddate"],
            "_a_batch": base["batchid"],
        }
    )
    cust = pa.table(
        {
            "_c_id": customers["customerid"],
            "sk_customerid": customers["sk_customerid"],
            "_c_st": customers["st_id"],
            "_c_eff": customers["effectivedate"],
            "_c_end": customers["enddate"],
            "_c_batch": customers["batchid"],
        }
    )
    # The customer version valid when the account version starts: customer versions run without gaps to the
    # end of time, so the account version is wholly covered exactly when this one exists.
    pairs = _overlapping(base, cust)
    starts = pairs.filter(pc.less_equal(pairs["_c_eff"], pairs["_a_eff"])) if pairs.num_rows else pairs
    covered = pc.is_in(base["_row"], value_set=starts["_row"].combine_chunks())
    base = base.append_column("_covered", covered)
    # each account version cut at the customer versions it overlaps; one piece without a customer when none does
    alone = base.filter(pc.invert(pc.is_in(base["_row"], value_set=pairs["_row"].combine_chunks())))
    joined = pairs.select(["_row", *cust.column_names[1:]]).join(base, "_row", join_type="inner")
    pieces = pa.concat_tables([joined, alone], promote_options="default")
    pieces = sort(pieces, ["accountid", "_a_eff", "_c_eff"])
    a_eff, a_end, c_eff, c_end = (column(pieces, c) for c in ("_a_eff", "_a_end", "_c_eff", "_c_end"))
    eff = pc.if_else(pc.is_null(c_eff), a_eff, pc.max_element_wise(a_eff, c_eff))
    end = pc.if_else(pc.is_null(c_end), a_end, pc.min_element_wise(a_end, c_end))
    a_batch, c_batch = column(pieces, "_a_batch"), column(pieces, "_c_batch")
    started_by = pc.if_else(
        pc.or_(pc.is_null(c_eff), pc.fill_null(pc.greater(a_eff, c_eff), False)),
        a_batch,
        pc.if_else(pc.greater(c_eff, a_eff), c_batch, pc.max_element_wise(a_batch, c_batch)),
    )
    st_code = pc.if_else(
        pc.fill_null(pc.equal(column(pieces, "_c_st"), INACTIVE), False), INACTIVE, column(pieces, "_a_st")
    )
    sk_broker = _broker_keys(column(pieces, "brokerid"), eff, brokers)
    status = lookup(st_code, status_types, "st_id", "st_name")
    sk_customer = column(pieces, "sk_customerid")
    no_customer = pc.or_(pc.invert(column(pieces, "_covered")), pc.is_null(sk_customer))
    problem = first_problem(
        pieces.num_rows,
        (no_customer, [f"no DimCustomer version of C_ID = {t}" for t in _dated(column(pieces, "customerid"), eff)]),
        (
            pc.is_null(sk_broker),
            [f"no DimBroker row of CA_B_ID = {t}" for t in _dated(column(pieces, "brokerid"), eff)],
        ),
        (pc.is_null(status), [f"unknown status code '{c}'" for c in pc.fill_null(st_code, "").to_pylist()]),
    )
    return pa.table(
        {
            "sk_accountid": surrogate_keys(column(pieces, "accountid"), eff),
            "accountid": column(pieces, "accountid"),
            "sk_brokerid": sk_broker,
            "sk_customerid": sk_customer,
            "accountdesc": column(pieces, "accountdesc"),
            "taxstatus": column(pieces, "taxstatus"),
            "status": status,
            "iscurrent": pc.equal(end, pa.scalar(END_OF_TIME, pa.date32())),
            "batchid": started_by,
            "effectivedate": eff,
            "enddate": end,
            "customerid": column(pieces, "customerid"),
            "brokerid": column(pieces, "brokerid"),
            "_problem": problem,
        }
    )


def _broker_keys(broker_ids: pa.Array, days: pa.Array, brokers: pa.Table) -> pa.Array:
    """`sk_brokerid` of the DimBroker row of each broker id valid on each day (NULL when there is none)."""
    rows = valid_versions(
        broker_ids, arrow_ops.days(days), brokers["brokerid"], brokers["effectivedate"], brokers["enddate"]
    )
    return take(brokers["sk_brokerid"], rows)
