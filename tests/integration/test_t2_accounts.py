"""T2 (jobs.create_accounts, jobs.customers, jobs.accounts, jobs.prospect): DimCustomer, DimAccount, Prospect and
the customer alerts from hand-written staged records.

Every expected row is written out by hand from the rules in the module docstring (TPC-DI 1.1.0, 4.5 DimCustomer
and DimAccount). Surrogate keys follow the declared rule `natural * 100000 + days since 1900-01-01`, restated
here (`sk`), not taken from the code under test.

The scenario: a CustomerMgmt.xml (TPC-DI batch 1, BatchDate 2017-07-07) with every action type, then an
incremental batch 2 (BatchDate 2017-07-08) with Customer.txt and Account.txt, and a Prospect.csv snapshot in each.
It is loaded once as two micro-batches (module fixture `loaded`), and once more cut into five micro-batches with
the BatchDates arriving late, Customer.txt split in two files delivered in reverse DSN order, an account arriving
before its customer and prospect lines arriving after the customers they match (`split`); both must end in
identical tables.
"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal

import pyarrow as pa
import pytest

from jobs import create_accounts
from jobs.customers import gender, phone_number
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.staging import CUSTOMER_MGMT
from streamdi.context import JobContext
from streamdi.lake import Lake

pytestmark = pytest.mark.integration

D = dt.date
UTC = dt.UTC
OPEN = D(9999, 12, 31)
B1, B2 = D(2017, 7, 7), D(2017, 7, 8)  # BatchDates of TPC-DI batches 1 and 2
XML = "Batch1/CustomerMgmt.xml"
CUST, CUST_B, ACCT = "Batch2/Customer.txt", "Batch2/Customer_2.txt", "Batch2/Account.txt"
PROSPECT1, PROSPECT2 = "Batch1/Prospect.csv", "Batch2/Prospect.csv"


def sk(natural: int, day: D) -> int:
    """The declared surrogate key rule, restated for the expectations."""
    return natural * 100_000 + (day - D(1900, 1, 1)).days


def ts(day: str, hms: str = "12:00:00") -> dt.datetime:
    return dt.datetime.fromisoformat(f"{day}T{hms}").replace(tzinfo=UTC)


# ----------------------------------------------------------------------------------------------- builders
FULL_CUSTOMER = dict(
    c_tax_id="111-11-1111",
    c_gndr="f",
    c_tier=1,
    c_dob=D(1960, 5, 1),
    c_l_name="Pelland",
    c_f_name="Ingrid",
    c_m_name="J",
    c_adline1="1 Misty Upper",
    c_adline2="Apt 2",
    c_zipcode="22659",
    c_city="Quebec",
    c_state_prov="QC",
    c_ctry="Canada",
    c_prim_email="ingrid@aggies.com",
    c_alt_email="ingrid@ip6.li",
    c_ctry_1="1",
    c_area_1="314",
    c_local_1="967-4725",
    c_ext_1="65",
    c_ctry_2=None,
    c_area_2=None,
    c_local_2=None,
    c_ext_2=None,
    c_ctry_3=None,
    c_area_3=None,
    c_local_3=None,
    c_ext_3=None,
    c_lcl_tx_id="L1",
    c_nat_tx_id="N1",
)


def action(kind: str, when: dt.datetime, seq: int, c_id: int, **fields) -> dict:
    """One staged CustomerMgmt action carrying exactly `fields` (a None value = present but empty)."""
    row = {c.name: None for c in CUSTOMER_MGMT.columns}
    row.update(fields)
    row.update(
        action_type=kind,
        action_ts=when,
        c_id=c_id,
        present_fields=",".join(["c_id", *fields]),
        source_batch=1,
        source_file=XML,
        action_seq=seq,
    )
    return row


def new(when: dt.datetime, seq: int, c_id: int, ca_id: int, ca_b_id: int, ca_name: str, **changes) -> dict:
    fields = {**FULL_CUSTOMER, **changes}
    fields = {k: v for k, v in fields.items() if v is not ABSENT}
    return action("NEW", when, seq, c_id, **fields, ca_id=ca_id, ca_tax_st=1, ca_b_id=ca_b_id, ca_name=ca_name)


ABSENT = object()  # a field the NEW action does not carry at all


def customer_line(dsn: int, flag: str, c_id: int, st: str = "ACTV", file: str = CUST, **changes) -> dict:
    values = {
        **{k: v for k, v in FULL_CUSTOMER.items() if k not in ("c_prim_email", "c_alt_email")},
        "c_email_1": "ingrid@aggies.com",
        "c_email_2": "ingrid@ip6.li",
        **changes,
    }
    return {
        "cdc_flag": flag,
        "cdc_dsn": dsn,
        "c_id": c_id,
        "c_st_id": st,
        **values,
        "source_batch": 2,
        "source_file": file,
        "line_no": dsn,
    }


def account_line(dsn: int, flag: str, ca_id: int, b_id: int, c_id: int, name: str, tax: int, st: str) -> dict:
    return {
        "cdc_flag": flag,
        "cdc_dsn": dsn,
        "ca_id": ca_id,
        "ca_b_id": b_id,
        "ca_c_id": c_id,
        "ca_name": name,
        "ca_tax_st": tax,
        "ca_st_id": st,
        "source_batch": 2,
        "source_file": ACCT,
        "line_no": dsn,
    }


def prospect_line(agency: str, batch: int, line: int, file: str | None = None, **fields) -> dict:
    """A staged Prospect.csv line: every field NULL unless given."""
    row = {c.name: None for c in src.PROSPECT.columns}
    row.update(agencyid=agency, **fields)
    row.update(source_batch=batch, source_file=file or (PROSPECT1 if batch == 1 else PROSPECT2), line_no=line)
    return row


# the customers' default match parts (FULL_CUSTOMER), spelt in other cases as prospects may spell them
PELLAND = dict(lastname="PELLAND", firstname="ingrid", addressline1="1 misty upper", addressline2="APT 2",
               postalcode="22659", city="Quebec", state="QC")  # fmt: skip
AAA9 = prospect_line("AAA9", 1, 1, **PELLAND, income=250_000, numberchildren=4, age=50, creditrating=700,
                     networth=50_000, numbercars=1, numbercreditcards=2, gender="f", maritalstatus="m")  # fmt: skip
BBB1 = prospect_line("BBB1", 1, 2, **PELLAND, creditrating=800, networth=10)  # same key, greater id: not used
CCC1 = prospect_line("CCC1", 1, 3, **{**PELLAND, "lastname": "Nakamura"}, networth=2_000_000, age=20,
                     creditrating=550, gender="X", ownorrentflag="o")  # fmt: skip
DDD1 = prospect_line("DDD1", 1, 4, lastname="Doe", firstname="Jo", addressline1="9 Elm", postalcode="1",
                     city="Town", state="ON", numbercars=4, numbercreditcards=8)  # fmt: skip
PROSPECTS_1 = [AAA9, BBB1, CCC1, DDD1]
# batch 2: AAA9 and BBB1 dropped, CCC1 changed (credit rating), DDD1 unchanged, EEE1 new
CCC1_2 = {**CCC1, "creditrating": 650, "source_batch": 2, "source_file": PROSPECT2, "line_no": 1}
DDD1_2 = {**DDD1, "source_batch": 2, "source_file": PROSPECT2, "line_no": 2}
EEE1 = prospect_line("EEE1", 2, 3, **PELLAND, income=60_000, creditrating=650, networth=150_000, age=30)
PROSPECTS_2 = [CCC1_2, DDD1_2, EEE1]

# The CustomerMgmt.xml of the scenario, in file order.
ACTIONS = [
    # customer 1: NEW with account 100, then every other action type
    new(ts("2007-07-09", "10:00:00"), 1, 1, 100, 10, "Main"),
    action("ADDACCT", ts("2007-07-10"), 2, 1, ca_id=101, ca_tax_st=2, ca_b_id=11, ca_name="Second"),
    new(
        ts("2007-07-11"),
        3,
        2,
        200,
        10,
        "Other",
        c_gndr=ABSENT,
        c_tier=ABSENT,
        c_ctry_1=None,
        c_area_1="415",
        c_local_1="555-0100",
        c_ext_1=None,
        c_ctry_2="1",
        c_area_2=None,
        c_local_2="555-0199",
        c_ext_2="12",
        c_area_3="212",
    ),  # fmt: skip
    action(
        "UPDCUST",
        ts("2007-07-12"),
        4,
        1,
        c_adline1="2 Congress Court",
        c_zipcode="85680",
        c_ctry_2="44",
        c_area_2="20",
        c_local_2="7946-0000",
        c_ext_2=None,
        c_alt_email=None,
        c_lcl_tx_id="L2",
    ),
    action("UPDACCT", ts("2007-07-14"), 5, 1, ca_id=100, ca_b_id=11),
    action("CLOSEACCT", ts("2007-07-15"), 6, 1, ca_id=101),
    # customer 3: NEW and UPDCUST the same day, and the account updated that day too: one version each
    new(ts("2007-07-16", "09:00:00"), 7, 3, 300, 10, "Third", c_gndr="x"),
    action("UPDCUST", ts("2007-07-16", "15:00:00"), 8, 3, c_l_name="Nakamura", c_gndr="M"),
    action("UPDACCT", ts("2007-07-16", "16:00:00"), 9, 3, ca_id=300, ca_name="Third renamed", ca_tax_st=0),
    # customer 5: out-of-range tier and birth date; the UPDCUST carries another bad tier
    new(ts("2007-07-17"), 10, 5, 500, 10, "Fifth", c_tier=4, c_dob=D(1917, 7, 6), c_gndr="B"),
    action("UPDCUST", ts("2007-07-18"), 11, 5, c_tier=0),
    action("UPDCUST", ts("2007-07-19"), 12, 5, c_city="Oakland"),  # carries no tier: no alert
    action("INACT", ts("2007-07-20"), 13, 1),
]

CUSTOMER_LINES = [
    customer_line(1, "U", 2, c_tier=2, c_gndr="F", c_email_1="two@one.com", c_email_2=None),
    customer_line(2, "I", 4, c_tier=None, c_dob=D(2018, 1, 1), c_ctry_1=None, c_area_1=None, c_ext_1=None),
    customer_line(3, "U", 2, c_tier=3, c_gndr="F", c_email_1="two@two.com", c_email_2=None),
]
ACCOUNT_LINES = [
    account_line(1, "I", 400, 11, 4, "Fourth", 2, "ACTV"),
    account_line(2, "U", 200, 10, 2, "Other", 1, "INAC"),
    account_line(3, "I", 600, 99, 2, "Unknown broker", 0, "ACTV"),
]


# ----------------------------------------------------------------------------------------------- harness
def make_context(spark, root) -> JobContext:
    from streamdi.settings import Settings

    ctx = JobContext(Settings(home=root), spark=spark, lake=Lake(root / "lake", spark))
    status = [("ACTV", "Active"), ("CMPT", "Completed"), ("INAC", "Inactive")]
    write(ctx, wh.STATUS_TYPE, [{"st_id": i, "st_name": n} for i, n in status])
    taxes = [("L1", "Local one", "0.01000"), ("L2", "Local two", "0.02000"), ("N1", "National one", "0.10000")]
    write(ctx, wh.TAX_RATE, [{"tx_id": i, "tx_name": n, "tx_rate": rate} for i, n, rate in taxes])
    brokers = [
        dict(
            sk_brokerid=sk(b, D(1950, 1, 1)),
            brokerid=b,
            managerid=1,
            firstname="B",
            lastname=str(b),
            middleinitial=None,
            branch=None,
            office=None,
            phone=None,
            iscurrent=True,
            batchid=1,
            effectivedate=D(1950, 1, 1),
            enddate=OPEN,
        )  # fmt: skip
        for b in (10, 11)
    ]
    write(ctx, wh.DIM_BROKER, brokers)
    return ctx


_writes = itertools.count(1)


def write(ctx: JobContext, table, rows: list[dict]) -> None:
    fixed = [{k: Decimal(v) if k == "tx_rate" else v for k, v in r.items()} for r in rows]
    ctx.lake.append(
        table, pa.Table.from_pylist(fixed, schema=table.arrow_schema()), app_id=f"w{next(_writes)}", version=1
    )


def stage(ctx: JobContext, micro: int, table, rows: list[dict]) -> None:
    write(ctx, table, [{**r, "batch_id": micro} for r in rows])


def scope(
    micro: int, files: list[str], dates: dict[int, D], newly: tuple[int, ...] = (), batches: tuple[int, ...] = ()
) -> BatchScope:
    return BatchScope(micro, batches, dates, newly, {f: i for i, f in enumerate(files)})


def table(ctx: JobContext, t) -> list[dict]:
    return ctx.lake.read_arrow(t).to_pylist()


def load_two_batches(ctx: JobContext) -> tuple[dict, dict]:
    """The scenario in two micro-batches: 1 = CustomerMgmt.xml (batch 1 dated), 2 = the batch 2 files; T2's rows of
    each."""
    stage(ctx, 1, CUSTOMER_MGMT, ACTIONS)
    stage(ctx, 1, src.PROSPECT.staging, PROSPECTS_1)
    first = create_accounts.run(ctx, scope(1, [XML, PROSPECT1, "Batch1/BatchDate.txt"], {1: B1}, (1,), (1,)))
    stage(ctx, 2, src.CUSTOMER.staging, CUSTOMER_LINES)
    stage(ctx, 2, src.ACCOUNT.staging, ACCOUNT_LINES)
    stage(ctx, 2, src.PROSPECT.staging, PROSPECTS_2)
    files = [CUST, ACCT, PROSPECT2, "Batch2/BatchDate.txt"]
    second = create_accounts.run(ctx, scope(2, files, {1: B1, 2: B2}, (2,), (2,)))
    return first, second


@pytest.fixture(scope="module")
def loaded(spark, tmp_path_factory):
    """`load_two_batches` in a lake of its own, shared by the module's tests that only read it."""
    ctx = make_context(spark, tmp_path_factory.mktemp("t2-loaded"))
    first, second = load_two_batches(ctx)
    return ctx, first, second


# ----------------------------------------------------------------------------------------------- expectations
def customer(cid: int, eff: D, end: D, batch: int, **fields) -> dict:
    row = dict(
        sk_customerid=sk(cid, eff),
        customerid=cid,
        taxid="111-11-1111",
        status="Active",
        lastname="Pelland",
        firstname="Ingrid",
        middleinitial="J",
        gender="F",
        tier=1,
        dob=D(1960, 5, 1),
        addressline1="1 Misty Upper",
        addressline2="Apt 2",
        postalcode="22659",
        city="Quebec",
        stateprov="QC",
        country="Canada",
        phone1="+1 (314) 967-472565",
        phone2=None,
        phone3=None,
        email1="ingrid@aggies.com",
        email2="ingrid@ip6.li",
        nationaltaxratedesc="National one",
        nationaltaxrate=Decimal("0.1"),
        localtaxratedesc="Local one",
        localtaxrate=Decimal("0.01"),
        agencyid=None,
        creditrating=None,
        networth=None,
        marketingnameplate=None,
        iscurrent=end == OPEN,
        batchid=batch,
        effectivedate=eff,
        enddate=end,
    )
    row.update(fields)
    return row


C1_UPD = dict(addressline1="2 Congress Court", postalcode="85680", phone2="+44 (20) 7946-0000", email2=None,
              localtaxratedesc="Local two", localtaxrate=Decimal("0.02"))  # fmt: skip
C2 = dict(gender="U", tier=None, phone1="(415) 555-0100", phone2="555-019912", phone3=None)
# Demographics of the prospect matching a version in its batch's snapshot (names, address and postal code equal
# upper-cased): batch 1 versions with the default match parts match AAA9 and BBB1 -- AAA9, the smaller id --,
# customer 3 (Nakamura) matches CCC1, batch 2 versions match EEE1; customer 1 after its UPDCUST moved: none.
# Nameplates written out from the rules: AAA9 income > 200,000, 4 children, age 50, net worth < 100,000; CCC1
# net worth > 1,000,000, credit rating < 600, age < 25 and net worth > 1,000,000; EEE1: no tag.
AAA9_TAGS = "HighValue+Expenses+Boomer+MoneyAlert"
BY_AAA9 = dict(agencyid="AAA9", creditrating=700, networth=50_000, marketingnameplate=AAA9_TAGS)
BY_CCC1 = dict(
    agencyid="CCC1", creditrating=550, networth=2_000_000, marketingnameplate="HighValue+MoneyAlert+Inherited"
)
BY_EEE1 = dict(agencyid="EEE1", creditrating=650, networth=150_000, marketingnameplate=None)

EXPECTED_CUSTOMERS = [
    customer(1, D(2007, 7, 9), D(2007, 7, 12), 1, **BY_AAA9),
    customer(1, D(2007, 7, 12), D(2007, 7, 20), 1, **C1_UPD),
    customer(1, D(2007, 7, 20), OPEN, 1, **C1_UPD, status="Inactive"),
    customer(2, D(2007, 7, 11), B2, 1, **C2, **BY_AAA9),
    # Customer.txt lines carry every field; DSN 3 is the day's last change of customer 2
    customer(2, B2, OPEN, 2, tier=3, email1="two@two.com", email2=None, **BY_EEE1),
    customer(3, D(2007, 7, 16), OPEN, 1, lastname="Nakamura", gender="M", **BY_CCC1),
    customer(4, B2, OPEN, 2, tier=None, dob=D(2018, 1, 1), phone1="967-4725", email1="ingrid@aggies.com", **BY_EEE1),
    customer(5, D(2007, 7, 17), D(2007, 7, 18), 1, tier=4, dob=D(1917, 7, 6), gender="U", **BY_AAA9),
    customer(5, D(2007, 7, 18), D(2007, 7, 19), 1, tier=0, dob=D(1917, 7, 6), gender="U", **BY_AAA9),
    customer(5, D(2007, 7, 19), OPEN, 1, tier=0, dob=D(1917, 7, 6), gender="U", city="Oakland", **BY_AAA9),
]


def prospect(line: dict, record: D, update: D, batch: int, is_customer: bool, nameplate: str | None, **fixed) -> dict:
    """An expected Prospect row: the line's fields (Gender, MaritalStatus, OwnOrRentFlag as `fixed` says)."""
    fields = {c.name: line[c.name] for c in src.PROSPECT.columns}
    ids = {"sk_recorddateid": int(record.strftime("%Y%m%d")), "sk_updatedateid": int(update.strftime("%Y%m%d"))}
    row = {"agencyid": fields.pop("agencyid"), **ids, "batchid": batch, "iscustomer": is_customer}
    return (
        row
        | fields
        | dict(gender="U", maritalstatus="U", ownorrentflag="U")
        | fixed
        | {"marketingnameplate": nameplate}
    )


EXPECTED_PROSPECTS = [
    # dropped from batch 2's snapshot: as batch 1 left them; customers 2 and 5 were current and active then
    prospect(AAA9, B1, B1, 1, True, AAA9_TAGS, gender="F", maritalstatus="M"),
    prospect(BBB1, B1, B1, 1, True, "MoneyAlert"),
    prospect(CCC1_2, B2, B2, 2, True, "HighValue+Inherited", ownorrentflag="O"),  # changed in batch 2
    prospect(DDD1_2, B2, B1, 1, False, "Expenses+Spender"),  # listed again unchanged
    prospect(EEE1, B2, B2, 2, True, None),  # new: matches customers 2 and 4
]


def account(
    aid: int, eff: D, end: D, batch: int, broker: int, cust: tuple[int, D], desc: str, tax: int, status="Active"
):
    return dict(
        sk_accountid=sk(aid, eff),
        accountid=aid,
        sk_brokerid=sk(broker, D(1950, 1, 1)),
        sk_customerid=sk(*cust),
        accountdesc=desc,
        taxstatus=tax,
        status=status,
        iscurrent=end == OPEN,
        batchid=batch,
        effectivedate=eff,
        enddate=end,
    )


J = D(2007, 7, 1)  # day arithmetic helper for July 2007


def jul(day: int) -> D:
    return J.replace(day=day)


EXPECTED_ACCOUNTS = [
    # 100: NEW; cut by the UPDCUST of its customer; UPDACCT (broker only, the name stays); INACT of the customer
    account(100, jul(9), jul(12), 1, 10, (1, jul(9)), "Main", 1),
    account(100, jul(12), jul(14), 1, 10, (1, jul(12)), "Main", 1),
    account(100, jul(14), jul(20), 1, 11, (1, jul(12)), "Main", 1),
    account(100, jul(20), OPEN, 1, 11, (1, jul(20)), "Main", 1, "Inactive"),
    # 101: ADDACCT; cut by the UPDCUST; CLOSEACCT; cut again by the INACT (still Inactive, new customer version)
    account(101, jul(10), jul(12), 1, 11, (1, jul(9)), "Second", 2),
    account(101, jul(12), jul(15), 1, 11, (1, jul(12)), "Second", 2),
    account(101, jul(15), jul(20), 1, 11, (1, jul(12)), "Second", 2, "Inactive"),
    account(101, jul(20), OPEN, 1, 11, (1, jul(20)), "Second", 2, "Inactive"),
    # 200: NEW in batch 1; closed by Account.txt on BatchDate 2, the day its customer changed: one version
    account(200, jul(11), B2, 1, 10, (2, jul(11)), "Other", 1),
    account(200, B2, OPEN, 2, 10, (2, B2), "Other", 1, "Inactive"),
    # 300: NEW, UPDCUST and UPDACCT on one day: one version with the day's last values
    account(300, jul(16), OPEN, 1, 10, (3, jul(16)), "Third renamed", 0),
    # 400: Account.txt insert for the customer inserted by Customer.txt the same batch
    account(400, B2, OPEN, 2, 11, (4, B2), "Fourth", 2),
    # 500: cut at each of its customer's versions
    account(500, jul(17), jul(18), 1, 10, (5, jul(17)), "Fifth", 1),
    account(500, jul(18), jul(19), 1, 10, (5, jul(18)), "Fifth", 1),
    account(500, jul(19), OPEN, 1, 10, (5, jul(19)), "Fifth", 1),
    # 600 names broker 99, which DimBroker does not have: kept out (see the alert)
]


def alert(batch: int, text: str, data: str, key: str, source: str = "DimCustomer") -> dict:
    return dict(
        messagedateandtime=dt.datetime.combine(B1 if batch == 1 else B2, dt.time(), UTC),
        batchid=batch,
        messagesource=source,
        messagetext=text,
        messagetype="Alert",
        messagedata=data,
        messagekey=key,
    )


# Tier and birth date are checked on new-customer records only: NEW actions (customer 2's has no C_TIER at all,
# customer 5's a 4) and Customer.txt lines (customer 4's empty tier); the UPDCUST of customer 5 with tier 0 is not.
EXPECTED_MESSAGES = [
    alert(1, "DOB out of range", "C_ID = 5, C_DOB = 1917-07-06", "dob C_ID=5 ACTION_SEQ=10"),
    alert(1, "Invalid customer tier", "C_ID = 2, C_TIER = ", "tier C_ID=2 ACTION_SEQ=3"),
    alert(1, "Invalid customer tier", "C_ID = 5, C_TIER = 4", "tier C_ID=5 ACTION_SEQ=10"),
    alert(
        2,
        "Account not loaded",
        "CA_ID = 600: no DimBroker row of CA_B_ID = 99 on 2017-07-08",
        "CA_ID=600",
        "DimAccount",
    ),  # fmt: skip
    alert(2, "DOB out of range", "C_ID = 4, C_DOB = 2018-01-01", "dob C_ID=4 CDC_DSN=2"),
    alert(2, "Invalid customer tier", "C_ID = 4, C_TIER = ", "tier C_ID=4 CDC_DSN=2"),
]


def by(rows: list[dict], *keys: str) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


# ----------------------------------------------------------------------------------------------- tests
def test_customers_from_every_action_type_and_customer_txt(loaded):
    ctx, _, _ = loaded
    assert by(table(ctx, wh.DIM_CUSTOMER), "customerid", "effectivedate") == EXPECTED_CUSTOMERS


def test_accounts_follow_their_actions_and_every_new_version_of_their_customer(loaded):
    ctx, _, _ = loaded
    assert by(table(ctx, wh.DIM_ACCOUNT), "accountid", "effectivedate") == EXPECTED_ACCOUNTS


def test_tier_and_dob_alerts_of_new_customer_records_and_unresolved_accounts(loaded):
    ctx, _, _ = loaded
    assert by(table(ctx, wh.DI_MESSAGES), "batchid", "messagesource", "messagekey") == EXPECTED_MESSAGES


def test_prospects_from_every_snapshot_with_their_dates_batch_and_customer_match(loaded):
    ctx, _, _ = loaded
    assert by(table(ctx, wh.PROSPECT), "agencyid") == EXPECTED_PROSPECTS


def test_a_third_snapshot_dates_each_prospect_by_the_batch_that_last_changed_it(spark, tmp_path_factory):
    """Batch 3 lists AAA9 again unchanged after batch 2 dropped it (updated in batch 1), CCC1 unchanged since batch 2
    changed it, and DDD1 changed; EEE1 is dropped. Batch 3 reads only its own lines: the earlier ones stand in as
    the Prospect rows the earlier batches left."""
    ctx = make_context(spark, tmp_path_factory.mktemp("t2-three"))
    load_two_batches(ctx)
    b3 = D(2017, 7, 9)
    third = [
        {**line, "source_batch": 3, "source_file": "Batch3/Prospect.csv", "line_no": n}
        for n, line in enumerate([AAA9, CCC1_2, {**DDD1_2, "networth": 5}], start=1)
    ]
    stage(ctx, 3, src.PROSPECT.staging, third)
    dates = {1: B1, 2: B2, 3: b3}
    assert create_accounts.run(ctx, scope(3, ["Batch3/Prospect.csv", "Batch3/BatchDate.txt"], dates, (3,), (3,))) == {
        "dimcustomer": 0, "dimaccount": 0, "dimessages": 0, "prospect": 3,
    }  # fmt: skip
    got = {
        r["agencyid"]: (r["sk_recorddateid"], r["sk_updatedateid"], r["batchid"], r["networth"])
        for r in table(ctx, wh.PROSPECT)
    }
    assert got == {
        "AAA9": (20170709, 20170707, 1, AAA9["networth"]),
        "BBB1": (20170707, 20170707, 1, 10),
        "CCC1": (20170709, 20170708, 2, CCC1["networth"]),
        "DDD1": (20170709, 20170709, 3, 5),
        "EEE1": (20170708, 20170708, 2, 150_000),
    }


def test_rows_reported_per_table(loaded):
    _, first, second = loaded
    # batch 1: every version of customers 1, 2, 3, 5 and of accounts 100..500; the 3 alerts; the 4 prospects
    assert first == {"dimcustomer": 8, "dimaccount": 13, "dimessages": 3, "prospect": 4}
    # batch 2: customers 2 and 4 (all their versions), accounts 200 and 400; the 3 alerts of batch 2; the
    # prospects batch 2 lists (the dropped ones are not recomputed)
    assert second == {"dimcustomer": 3, "dimaccount": 3, "dimessages": 3, "prospect": 3}


def test_rerunning_a_committed_micro_batch_changes_nothing(loaded):
    ctx, _, _ = loaded
    tables = (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES, wh.PROSPECT)
    before = {t.name: (ctx.lake.version(t), table(ctx, t)) for t in tables}
    files = [CUST, ACCT, PROSPECT2, "Batch2/BatchDate.txt"]
    again = create_accounts.run(ctx, scope(2, files, {1: B1, 2: B2}, (2,), (2,)))
    assert again == {}
    assert {t.name: (ctx.lake.version(t), table(ctx, t)) for t in tables} == before


def test_any_split_into_micro_batches_in_any_order_gives_the_same_tables(loaded, spark, tmp_path_factory):
    """Five micro-batches: the XML with half of batch 1's prospects before any BatchDate (versions now, alerts
    when batch 1 is dated); then the BatchDate of batch 1 with the other prospects, among them AAA9, which the
    customers already built match (they are rebuilt with its demographics); then Account.txt with the second half
    of Customer.txt (DSN 3, the later change of customer 2 that day), the BatchDate of batch 2 and one prospect
    line: account 400 names customer 4, not staged yet, so it waits with an alert; then the first half of
    Customer.txt (DSN 1 and 2), with DSN 2 delivered twice, and the rest of batch 2's prospects resolve it and
    the alert goes away; then nothing relevant."""
    ctx, _, _ = loaded
    split = make_context(spark, tmp_path_factory.mktemp("t2-split"))
    stage(split, 1, CUSTOMER_MGMT, ACTIONS)
    stage(split, 1, src.PROSPECT.staging, [{**p, "source_file": "Batch1/Prospect_a.csv"} for p in (BBB1, CCC1)])
    assert create_accounts.run(split, scope(1, [XML, "Batch1/Prospect_a.csv"], {}, (), (1,)))["dimessages"] == 0
    stage(split, 2, src.PROSPECT.staging, [{**p, "source_file": "Batch1/Prospect_b.csv"} for p in (AAA9, DDD1)])
    create_accounts.run(split, scope(2, ["Batch1/BatchDate.txt", "Batch1/Prospect_b.csv"], {1: B1}, (1,), (1,)))
    assert {r["agencyid"] for r in table(split, wh.DIM_CUSTOMER) if r["customerid"] == 5} == {"AAA9"}
    stage(split, 3, src.CUSTOMER.staging, [{**CUSTOMER_LINES[2], "source_file": CUST_B, "line_no": 1}])
    stage(split, 3, src.ACCOUNT.staging, ACCOUNT_LINES)
    stage(split, 3, src.PROSPECT.staging, [{**CCC1_2, "source_file": "Batch2/Prospect_a.csv"}])
    files = [CUST_B, ACCT, "Batch2/BatchDate.txt", "Batch2/Prospect_a.csv"]
    create_accounts.run(split, scope(3, files, {1: B1, 2: B2}, (2,), (2,)))
    waiting = [m for m in table(split, wh.DI_MESSAGES) if m["messagekey"] == "CA_ID=400"]
    assert [m["messagedata"] for m in waiting] == ["CA_ID = 400: no DimCustomer version of C_ID = 4 on 2017-07-08"]
    assert 400 not in {r["accountid"] for r in table(split, wh.DIM_ACCOUNT)}
    duplicate = {**CUSTOMER_LINES[1], "source_file": "Batch2/Customer_again.txt", "line_no": 1}
    stage(split, 4, src.CUSTOMER.staging, [*CUSTOMER_LINES[:2], duplicate])
    stage(split, 4, src.PROSPECT.staging, [{**p, "source_file": "Batch2/Prospect_b.csv"} for p in (DDD1_2, EEE1)])
    files = [CUST, "Batch2/Customer_again.txt", "Batch2/Prospect_b.csv"]
    create_accounts.run(split, scope(4, files, {1: B1, 2: B2}, (), (2,)))
    assert create_accounts.run(split, scope(5, ["Batch2/Trade.txt"], {1: B1, 2: B2}, (), (2,))) == {}
    for t in (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES, wh.PROSPECT):
        assert table(split, t) == table(ctx, t), t.name


def test_the_keys_to_rebuild_are_read_from_the_staged_records(loaded):
    """`rebuilt_keys` (delta-rs): micro-batch 2 brings customers 2 and 4 (Customer.txt) and accounts 400, 200
    and 600 (Account.txt; 200 and 600 are also customer 2's); had only batch 1 just been dated, every
    CustomerMgmt action would be new and batch 2's lines would still wait for their date."""
    ctx, _, _ = loaded
    customers, accounts_ = create_accounts.rebuilt_keys(ctx, scope(2, [CUST, ACCT], {1: B1, 2: B2}, (2,)))
    assert (sorted(customers.to_pylist()), sorted(accounts_.to_pylist())) == ([2, 4], [200, 400, 600])
    customers, accounts_ = create_accounts.rebuilt_keys(ctx, scope(2, [CUST, ACCT], {1: B1}, (1,)))
    assert (sorted(customers.to_pylist()), sorted(accounts_.to_pylist())) == ([1, 2, 3, 5], [100, 101, 200, 300, 500])


def test_every_staged_record_read_gives_the_same_tables(loaded, spark, tmp_path_factory, monkeypatch):
    """The scenario again with every staged record read, never only the records of the keys to rebuild."""
    ctx, _, _ = loaded
    monkeypatch.setattr(create_accounts.BatchScope, "staged_before", lambda self, ctx, tables: False)
    again = make_context(spark, tmp_path_factory.mktemp("t2-every-record"))
    stage(again, 1, CUSTOMER_MGMT, ACTIONS)
    stage(again, 1, src.PROSPECT.staging, PROSPECTS_1)
    create_accounts.run(again, scope(1, [XML, PROSPECT1, "Batch1/BatchDate.txt"], {1: B1}, (1,), (1,)))
    stage(again, 2, src.CUSTOMER.staging, CUSTOMER_LINES)
    stage(again, 2, src.ACCOUNT.staging, ACCOUNT_LINES)
    stage(again, 2, src.PROSPECT.staging, PROSPECTS_2)
    files = [CUST, ACCT, PROSPECT2, "Batch2/BatchDate.txt"]
    create_accounts.run(again, scope(2, files, {1: B1, 2: B2}, (2,), (2,)))
    for t in (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES, wh.PROSPECT):
        assert table(again, t) == table(ctx, t), t.name


def test_a_rebuilt_customer_keeps_its_stored_demographics_and_reads_only_new_snapshots(
    loaded, spark, tmp_path_factory, monkeypatch
):
    """Micro-batch 2 rebuilds customer 2, whose batch-1 version matches AAA9: that version keeps the demographics
    it was stored with, and only batch 2's snapshot is read (batch 1's snapshot cannot change it: none of its
    lines is new). The tables end as in the scenario."""
    from jobs import prospect

    ctx, _, _ = loaded
    again = make_context(spark, tmp_path_factory.mktemp("t2-reuse"))
    read: list[list[int] | None] = []
    original = prospect.staged_lines

    def spy(ctx_, scope_, batches=None):
        read.append(batches)
        return original(ctx_, scope_, batches)

    monkeypatch.setattr(prospect, "staged_lines", spy)
    stage(again, 1, CUSTOMER_MGMT, ACTIONS)
    stage(again, 1, src.PROSPECT.staging, PROSPECTS_1)
    create_accounts.run(again, scope(1, [XML, PROSPECT1, "Batch1/BatchDate.txt"], {1: B1}, (1,), (1,)))
    assert read == [[1]]
    read.clear()
    stage(again, 2, src.CUSTOMER.staging, CUSTOMER_LINES)
    stage(again, 2, src.ACCOUNT.staging, ACCOUNT_LINES)
    stage(again, 2, src.PROSPECT.staging, PROSPECTS_2)
    create_accounts.run(again, scope(2, [CUST, ACCT, PROSPECT2, "Batch2/BatchDate.txt"], {1: B1, 2: B2}, (2,), (2,)))
    assert read == [[2]]
    for t in (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES, wh.PROSPECT):
        assert table(again, t) == table(ctx, t), t.name


def test_a_prospect_listed_again_in_its_snapshot_leaves_the_customers_its_earlier_line_matched(spark, tmp_path_factory):
    """Batch 1's snapshot lists AAA0 twice: first with the Pelland match key (AAA0 < AAA9: the customers take it),
    then, in a later piece, with a greater line (another last name), which a snapshot keeps. Delivered in one
    micro-batch, the Pelland customers never match AAA0; delivered in two, the second piece must rebuild the
    customers the first one gave AAA0 (its line does not name them), and both ways end alike."""
    first = prospect_line("AAA0", 1, 5, "Batch1/Prospect_a.csv", **PELLAND, creditrating=300)
    second = prospect_line("AAA0", 1, 1, "Batch1/Prospect_b.csv", **{**PELLAND, "lastname": "Zyx"}, creditrating=310)
    dated = {1: B1}
    whole = make_context(spark, tmp_path_factory.mktemp("t2-listed-twice-whole"))
    stage(whole, 1, CUSTOMER_MGMT, ACTIONS)
    stage(whole, 1, src.PROSPECT.staging, [*PROSPECTS_1, first, second])
    files = [XML, PROSPECT1, "Batch1/Prospect_a.csv", "Batch1/Prospect_b.csv", "Batch1/BatchDate.txt"]
    create_accounts.run(whole, scope(1, files, dated, (1,), (1,)))
    split = make_context(spark, tmp_path_factory.mktemp("t2-listed-twice-split"))
    stage(split, 1, CUSTOMER_MGMT, ACTIONS)
    stage(split, 1, src.PROSPECT.staging, [*PROSPECTS_1, first])
    create_accounts.run(
        split, scope(1, [XML, PROSPECT1, "Batch1/Prospect_a.csv", "Batch1/BatchDate.txt"], dated, (1,), (1,))
    )
    assert {r["agencyid"] for r in table(split, wh.DIM_CUSTOMER) if r["customerid"] == 5} == {"AAA0"}
    stage(split, 2, src.PROSPECT.staging, [second])
    create_accounts.run(split, scope(2, ["Batch1/Prospect_b.csv"], dated, (), (1,)))
    assert {r["agencyid"] for r in table(split, wh.DIM_CUSTOMER) if r["customerid"] == 5} == {"AAA9"}
    for t in (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES, wh.PROSPECT):
        assert table(split, t) == table(whole, t), t.name


# ----------------------------------------------------------------------------------------------- field rules
def test_phone_number_format():
    cases = [
        (("1", "314", "967-4725", None), "+1 (314) 967-4725"),
        (("1", "314", "967-4725", "65"), "+1 (314) 967-472565"),
        ((None, "314", "967-4725", None), "(314) 967-4725"),
        (("1", None, "967-4725", "7"), "967-47257"),
        ((None, None, "967-4725", None), "967-4725"),
        (("1", "314", None, "65"), None),
        ((None, None, None, None), None),
    ]
    parts = [pa.array([c[0][i] for c in cases], pa.large_string()) for i in range(4)]
    assert phone_number(*parts).to_pylist() == [want for _, want in cases]


def test_gender_normalisation():
    codes = pa.array(["M", "f", " m ", "x", "", None, "\tm"], pa.large_string())
    assert gender(codes).to_pylist() == ["M", "F", "M", "U", "U", "U", "U"]  # only spaces are trimmed, as in Spark


def test_files_decide_what_a_micro_batch_touches():
    t = create_accounts.triggers(scope(5, ["x/Batch1/CustomerMgmt.xml", "Batch1/HR.csv"], {}))
    assert (t.records, t.statuses, t.tax_rates, t.brokers, t.dated) == (True, False, False, True, False)
    t = create_accounts.triggers(scope(5, ["Batch2/Prospect_batch2_0003.csv"], {}))
    assert (t.records, t.prospects, t.any) == (False, True, True)
    t = create_accounts.triggers(scope(5, ["Batch1/StatusType.txt", "Batch1/TaxRate.txt"], {1: B1}, (1,)))
    assert (t.records, t.statuses, t.tax_rates, t.brokers, t.dated) == (False, True, True, False, True)
    assert not create_accounts.triggers(scope(5, ["Batch2/Trade.txt", "Batch2/Customer_audit.csv"], {})).any
