"""Customers and accounts: CustomerMgmt.xml (Batch1), Customer.txt and Account.txt (incremental), Prospect.csv.

One event history drives all three. Customer management actions are drawn in time order; an action only
refers to customers and accounts that exist and are active at its time (ADDACCT, UPDACCT, UPDCUST,
CLOSEACCT, INACT), and every account is served by a broker from HR.csv (job code 314). Batch1's actions go
to CustomerMgmt.xml; each incremental batch delivers its day's new and changed customers and accounts as
full CDC rows. Out-of-range tiers and birth dates occur at a low rate (and at least once in Batch1) so that
the DImessages alerts fire. The account timeline (open/close times) is returned for the trade and watch
generators, which only pick accounts and customers that are active at the event's time.

Long because one event history (`_History`) drives four files: its XML and CDC writers read and change the same
state at each action, and spreading them over modules would pass that state across every boundary.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

import numpy as np
import pyarrow as pa

from schemas.sources import CUSTOMER_MGMT_XML
from streamdi.generator import reference_data as ref
from streamdi.generator import text as tx
from streamdi.generator.output import AuditRow, Output
from streamdi.generator.params import CM_BEGIN, Params, epoch_seconds
from streamdi.generator.reference import FIRST_NAMES, LAST_NAMES

ACTION_WEIGHTS = {"NEW": 0.33, "ADDACCT": 0.29, "UPDACCT": 0.18, "UPDCUST": 0.09, "CLOSEACCT": 0.08, "INACT": 0.03}
BAD_VALUE_RATE = 0.004
STREETS = ("Weller Way", "Gates Avenue", "Misty Upper", "Corsicana Road", "Vickery West", "Kingsbridge Avenue",
           "Olympia Street", "Congress Court", "Frailing West", "Rogers North", "Four Points Drive")  # fmt: skip
CITIES = ("Columbus", "Inglewood", "Berkeley", "Overland Park", "Oakland", "Abilene", "Fairbanks", "Quebec", "Augusta")
STATES = ("Ontario", "WI", "Saskatchewan", "DC", "Nova Scotia", "Newfoundland", "MA", "PA", "British Columbia")
COUNTRIES = ("United States of America", "Canada")
DOMAINS = ("moose-mail.com", "gmx.com", "ip6.li", "devils.com", "aggies.com", "gawab.com", "letterbox.org")
TAX_IDS = tuple(line.split("|", 1)[0] for line in ref.TAXRATE_LINES)
CUSTOMER_FIELDS = (
    "c_tax_id", "c_gndr", "c_tier", "c_dob", "c_l_name", "c_f_name", "c_m_name", "c_adline1", "c_adline2",
    "c_zipcode", "c_city", "c_state_prov", "c_ctry", "c_prim_email", "c_alt_email",
    *(f"c_{p}_{n}" for n in (1, 2, 3) for p in ("ctry", "area", "local", "ext")),
    "c_lcl_tx_id", "c_nat_tx_id",
)  # fmt: skip
UPDATABLE = ("c_tier", "c_adline1", "c_adline2", "c_zipcode", "c_city", "c_state_prov", "c_ctry", "c_prim_email",
             "c_alt_email", "c_local_1", "c_area_1", "c_local_2", "c_lcl_tx_id")  # fmt: skip


def _digits(rng: np.random.Generator, n: int, width: int) -> list[str]:
    return tx.zero_padded(rng.integers(0, 10**width, n), width).to_pylist()


def _emails(rng: np.random.Generator, first: list[str], last: list[str]) -> list[str]:
    domains = tx.choice(rng, DOMAINS, len(first)).to_pylist()
    return [f"{f}.{la}@{d}" for f, la, d in zip(first, last, domains, strict=True)]


def _maybe(rng: np.random.Generator, values: list[str] | np.ndarray, null_rate: float) -> np.ndarray:
    """The values as an object array with about `null_rate` of them replaced by None (empty)."""
    values = np.asarray(values, dtype=object)
    return np.where(rng.random(len(values)) < null_rate, None, values)


def profile_columns(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """n customers' worth of field values, column by column (text as written; None = empty)."""
    first, last = tx.choice(rng, FIRST_NAMES, n).to_pylist(), tx.choice(rng, LAST_NAMES, n).to_pylist()
    dob_days = rng.integers(epoch_seconds(dt.date(1920, 1, 1)), epoch_seconds(dt.date(2000, 1, 1)), n) // 86400
    streets = tx.choice(rng, STREETS, n).to_pylist()
    cols: dict[str, np.ndarray] = {
        "c_tax_id": np.asarray(
            [
                f"{a}-{b}-{c}"
                for a, b, c in zip(_digits(rng, n, 3), _digits(rng, n, 2), _digits(rng, n, 4), strict=True)
            ],
            dtype=object,
        ),
        "c_gndr": _maybe(rng, tx.choice(rng, ("M", "F"), n).to_pylist(), 0.06),
        "c_tier": _maybe(rng, np.asarray(["1", "2", "3"], dtype=object)[rng.integers(0, 3, n)], 0.03),
        "c_dob": np.asarray(tx.dates(dob_days).to_pylist(), dtype=object),
        "c_l_name": np.asarray(last, dtype=object),
        "c_f_name": np.asarray(first, dtype=object),
        "c_m_name": _maybe(rng, tx.LETTERS[rng.integers(0, 26, n)].view("S1").astype(str), 0.6),
        "c_adline1": np.asarray([f"{k} {st}" for k, st in zip(rng.integers(1, 30000, n), streets, strict=True)]),
        "c_adline2": _maybe(rng, [f"Apt. {k}" for k in rng.integers(1, 999, n)], 0.85),
        "c_zipcode": np.asarray(tx.ints(rng.integers(10000, 99999, n)).to_pylist(), dtype=object),
        "c_city": np.asarray(tx.choice(rng, CITIES, n).to_pylist(), dtype=object),
        "c_state_prov": np.asarray(tx.choice(rng, STATES, n).to_pylist(), dtype=object),
        "c_ctry": _maybe(rng, tx.choice(rng, COUNTRIES, n).to_pylist(), 0.05),
        "c_prim_email": np.asarray(_emails(rng, first, last), dtype=object),
        "c_alt_email": _maybe(rng, _emails(rng, first, last), 0.2),
        "c_lcl_tx_id": np.asarray(tx.spread(rng, TAX_IDS, n).to_pylist(), dtype=object),
        "c_nat_tx_id": np.asarray(tx.spread(rng, TAX_IDS, n).to_pylist(), dtype=object),
    }
    for k, share in ((1, 0.9), (2, 0.5), (3, 0.2)):
        present = rng.random(n) < share
        local = [f"{a}-{b}" for a, b in zip(_digits(rng, n, 3), _digits(rng, n, 4), strict=True)]
        cols[f"c_ctry_{k}"] = np.where(present & (rng.random(n) < 0.3), "1", None)
        cols[f"c_area_{k}"] = np.where(present & (rng.random(n) < 0.7), tx.ints(rng.integers(200, 1000, n)), None)
        cols[f"c_local_{k}"] = np.where(present, np.asarray(local, dtype=object), None)
        cols[f"c_ext_{k}"] = np.where(present & (rng.random(n) < 0.1), tx.ints(rng.integers(1, 99999, n)), None)
    return cols


def profiles(rng: np.random.Generator, n: int) -> list[dict[str, str | None]]:
    """`profile_columns` as one dict per customer."""
    cols = profile_columns(rng, n)
    names = list(cols)
    return [dict(zip(names, row, strict=True)) for row in zip(*(cols[c].tolist() for c in names), strict=True)]


@dataclass
class People:
    """The customer and account timelines, for the trade, watch and prospect generators."""

    customer_created: list[int] = field(default_factory=list)
    customer_inactive: list[int] = field(default_factory=list)  # epoch seconds; a large value = never
    account_customer: list[int] = field(default_factory=list)
    account_opened: list[int] = field(default_factory=list)
    account_closed: list[int] = field(default_factory=list)
    current: list[dict[str, str | None]] = field(default_factory=list)  # every customer's latest values
    match_keys: dict[int, set[tuple]] = field(default_factory=dict)  # per batch: keys of active customers

    def arrays(self) -> dict[str, np.ndarray]:
        names = ("customer_created", "customer_inactive", "account_customer", "account_opened", "account_closed")
        return {k: np.asarray(getattr(self, k), dtype=np.int64) for k in names}


def match_key(values: dict[str, str | None]) -> tuple:
    return tuple((values.get(k) or "").upper() for k in ("c_f_name", "c_l_name", "c_adline1", "c_adline2", "c_zipcode"))


class _History:
    """The mutable state while actions are drawn in time order."""

    def __init__(self, params: Params, brokers: np.ndarray) -> None:
        self.params = params
        self.brokers = brokers
        self.never = params.horizon + 10**9
        self.people = People()
        self.account_state: list[dict[str, str | None]] = []
        self.active_customers: list[int] = []  # order of creation, for deterministic picks
        # the day of each customer's last change: a customer changes at most once a day, as in the official
        # files (their C_ID_HIST is 0: every NEW, UPDCUST and INACT makes a DimCustomer version of its own)
        self.customer_day: dict[int, int] = {}
        self.active_accounts: list[int] = []
        self._names: list[str] = []
        self._name_rng = params.rng("CustomerMgmt", "account names")

    def account_name(self) -> str:
        """The next random account name (drawn in blocks: one Arrow call per 1024 names)."""
        if not self._names:
            self._names = tx.random_text(self._name_rng, 1024, 10, 50).to_pylist()[::-1]
        return self._names.pop()

    def pick_customer(self, rng: np.random.Generator, day: int, tries: int = 8) -> int | None:
        """A random active customer not yet changed on `day` (None when `tries` draws find none)."""
        for _ in range(tries):
            cid = self.active_customers[int(rng.integers(0, len(self.active_customers)))]
            if self.customer_day.get(cid) != day:
                self.customer_day[cid] = day
                return cid
        return None

    def new_customer(self, ts: int, profile: dict, day: int | None = None) -> int:
        cid = len(self.people.current)
        self.customer_day[cid] = ts // 86400 if day is None else day
        self.people.current.append(dict(profile))
        self.people.customer_created.append(ts)
        self.people.customer_inactive.append(self.never)
        self.active_customers.append(cid)
        return cid

    def new_account(self, ts: int, cid: int, rng: np.random.Generator) -> int:
        aid = len(self.account_state)
        name = None if rng.random() < 0.05 else self.account_name()
        self.account_state.append(
            {"ca_b_id": str(int(self.brokers[rng.integers(0, len(self.brokers))])), "ca_name": name,
             "ca_tax_st": str(int(rng.integers(0, 3))), "ca_st_id": "ACTV"}
        )  # fmt: skip
        self.people.account_customer.append(cid)
        self.people.account_opened.append(ts)
        self.people.account_closed.append(self.never)
        self.active_accounts.append(aid)
        return aid

    def close_account(self, ts: int, aid: int) -> None:
        self.people.account_closed[aid] = ts
        self.account_state[aid]["ca_st_id"] = "INAC"
        self.active_accounts.remove(aid)

    def inactivate(self, ts: int, cid: int) -> None:
        self.people.customer_inactive[cid] = ts
        self.active_customers.remove(cid)
        for aid in [a for a in self.active_accounts if self.people.account_customer[a] == cid]:
            self.close_account(ts, aid)

    def snapshot_keys(self, batch: int) -> None:
        self.people.match_keys[batch] = {match_key(self.people.current[c]) for c in self.active_customers}


def _bad_values(
    values: dict,
    rng: np.random.Generator,
    batch_date: dt.date,
    force: str | None,
    kinds: tuple[str, ...] = ("tier", "old", "young"),
) -> None:
    """Make a tier or birth date out of range now and then (and whenever `force` names one)."""
    kind = force or (str(rng.choice(kinds)) if rng.random() < BAD_VALUE_RATE else None)
    if kind == "tier":
        values["c_tier"] = str(int(rng.choice([0, 4, 5, 9])))
    elif kind == "old":
        values["c_dob"] = (batch_date - dt.timedelta(days=int(365.25 * 100) + int(rng.integers(10, 5000)))).isoformat()
    elif kind == "young":
        values["c_dob"] = (batch_date + dt.timedelta(days=int(rng.integers(1, 900)))).isoformat()


def _classify(values: dict, batch_date: dt.date) -> set[str]:
    """The alert figures a new-customer record (a NEW action or a Customer.txt line) counts in, as the official
    generator counts them: a tier that is absent or not 1-3, a birth date before BatchDate - 100 years or after it.
    UPDCUST actions are not counted."""
    found = set()
    if values.get("c_tier") not in ("1", "2", "3"):
        found.add("C_TIER_INV")
    if values.get("c_dob"):
        dob = dt.date.fromisoformat(values["c_dob"])
        if dob < dt.date(batch_date.year - 100, batch_date.month, batch_date.day):
            found.add("C_DOB_TO")
        if dob > batch_date:
            found.add("C_DOB_TY")
    return found


# ------------------------------------------------------------------------------------------------ XML
def _element(tag: str, value: str | None, indent: int) -> str:
    pad = "\t" * indent
    return f"{pad}<{tag}/>" if value is None else f"{pad}<{tag}>{escape(value)}</{tag}>"


# The customer's child elements, in document order, from the declaration in schemas.sources:
# (field name, element path below Customer), e.g. ("c_area_1", ("ContactInfo", "C_PHONE_1", "C_AREA_CODE")).
_CHILDREN = tuple(
    (f.name, tuple(f.path.split("/")[1:]))
    for f in CUSTOMER_MGMT_XML
    if f.path.startswith("Customer/") and "@" not in f.path and not f.path.startswith("Customer/Account")
)


def _customer_children(values: dict, fields: set[str] | None) -> list[str]:
    """The Name/Address/ContactInfo/TaxInfo elements; with `fields`, only those fields (a phone goes whole)."""

    def wanted(name: str, path: tuple[str, ...]) -> bool:
        if fields is None:
            return True
        if len(path) == 3:  # a phone number: all its parts or none
            return any(n in fields for n, p in _CHILDREN if p[:2] == path[:2])
        return name in fields

    out: list[str] = []
    opened: tuple[str, ...] = ()
    for name, path in _CHILDREN:
        if not wanted(name, path):
            continue
        containers = path[:-1]
        common = 0
        while common < min(len(opened), len(containers)) and opened[common] == containers[common]:
            common += 1
        out.extend("\t" * (3 + depth) + f"</{opened[depth]}>" for depth in range(len(opened) - 1, common - 1, -1))
        out.extend("\t" * (3 + depth) + f"<{containers[depth]}>" for depth in range(common, len(containers)))
        opened = containers
        out.append(_element(path[-1], values.get(name), 3 + len(containers)))
    out.extend("\t" * (3 + depth) + f"</{opened[depth]}>" for depth in range(len(opened) - 1, -1, -1))
    return out


def _account_element(aid: int, state: dict) -> list[str]:
    return [
        f'\t\t\t<Account CA_ID="{aid}" CA_TAX_ST="{state["ca_tax_st"]}">',
        _element("CA_B_ID", state["ca_b_id"], 4),
        _element("CA_NAME", state["ca_name"], 4),
        "\t\t\t</Account>",
    ]


def _action(kind: str, ts: int, body: list[str]) -> list[str]:
    stamp = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=int(ts))
    return [
        f'\t<TPCDI:Action ActionType="{kind}" ActionTS="{stamp.strftime("%Y-%m-%dT%H:%M:%S")}">',
        *body,
        "\t</TPCDI:Action>",
    ]


def _customer_attrs(cid: int, values: dict, names: tuple[str, ...]) -> str:
    attrs = [f'C_ID="{cid}"'] + [f"{n.upper()}={quoteattr(values[n])}" for n in names if values.get(n) is not None]
    return " ".join(attrs)


# ------------------------------------------------------------------------------------------------ main
def generate(params: Params, out: Output, brokers: np.ndarray) -> People:
    """Write CustomerMgmt.xml and, per incremental batch, Customer.txt and Account.txt; return the timelines."""
    hist = _History(params, brokers)
    _batch1(params, out, hist)
    for batch in range(2, params.batches + 1):
        _incremental(params, out, hist, batch)
    return hist.people


def _batch1(params: Params, out: Output, hist: _History) -> None:
    rng = params.rng("CustomerMgmt")
    n = params.cm_actions
    start, end = epoch_seconds(CM_BEGIN), params.window(1)[1]
    times = np.sort(rng.integers(start, end, n))
    kinds = rng.choice(list(ACTION_WEIGHTS), n, p=list(ACTION_WEIGHTS.values()))
    pool = profiles(params.rng("CustomerMgmt", "profiles"), n)
    updates = profiles(params.rng("CustomerMgmt", "updates"), n)
    batch_date = params.batch_date(1)
    forced = ["tier", "old", "young"]  # one of each alert in every data set
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', '<TPCDI:Actions xmlns:TPCDI="http://www.tpc.org/tpc-di">']
    counts = dict.fromkeys(("CA_ADDACCT", "CA_CLOSEACCT", "CA_UPDACCT", "C_NEW", "C_UPDCUST", "C_INACT"), 0)
    counts |= dict.fromkeys(("C_DOB_TO", "C_DOB_TY", "C_TIER_INV"), 0)
    for i in range(n):
        ts, kind = int(times[i]), str(kinds[i])
        if kind in ("ADDACCT", "UPDCUST", "INACT") and len(hist.active_customers) < 2:
            kind = "NEW"
        changed = hist.pick_customer(rng, ts // 86400) if kind in ("UPDCUST", "INACT") else None
        if kind in ("UPDCUST", "INACT") and changed is None:
            kind = "NEW"
        if kind in ("UPDACCT", "CLOSEACCT") and len(hist.active_accounts) < 2:
            kind = "NEW"
        if kind == "NEW":
            values = dict(pool[i])
            if counts["C_NEW"] >= 1 and forced:
                _bad_values(values, rng, batch_date, forced.pop(0))
            else:
                _bad_values(values, rng, batch_date, None)
            cid = hist.new_customer(ts, values)
            aid = hist.new_account(ts, cid, rng)
            attrs = _customer_attrs(cid, values, ("c_tax_id", "c_gndr", "c_tier", "c_dob"))
            body = [
                f"\t\t<Customer {attrs}>",
                *_customer_children(values, None),
                *_account_element(aid, hist.account_state[aid]),
                "\t\t</Customer>",
            ]
            for alert in _classify(values, batch_date):
                counts[alert] += 1
            counts["C_NEW"] += 1
        elif kind == "ADDACCT":
            cid = hist.active_customers[int(rng.integers(0, len(hist.active_customers)))]
            aid = hist.new_account(ts, cid, rng)
            body = [f'\t\t<Customer C_ID="{cid}" >', *_account_element(aid, hist.account_state[aid]), "\t\t</Customer>"]
            counts["CA_ADDACCT"] += 1
        elif kind == "UPDACCT":
            aid = hist.active_accounts[int(rng.integers(0, len(hist.active_accounts)))]
            cid = hist.people.account_customer[aid]
            state = hist.account_state[aid]
            state["ca_b_id"] = str(int(hist.brokers[rng.integers(0, len(hist.brokers))]))
            if rng.random() < 0.5:
                state["ca_name"] = hist.account_name()
            body = [f'\t\t<Customer C_ID="{cid}" >', *_account_element(aid, state), "\t\t</Customer>"]
            counts["CA_UPDACCT"] += 1
        elif kind == "UPDCUST":
            cid = changed
            values = hist.people.current[cid]
            chosen = {str(f) for f in rng.choice(UPDATABLE, int(rng.integers(1, 5)), replace=False)}
            for f in chosen:
                values[f] = updates[i][f]
            if "c_tier" in chosen:  # only the tier can go bad here: the birth date is not part of the update
                _bad_values(values, rng, batch_date, None, kinds=("tier",))
            attrs = _customer_attrs(cid, values, ("c_tier",) if "c_tier" in chosen else ())
            children_fields = chosen | ({"c_local_1"} if "c_area_1" in chosen else set())
            body = [f"\t\t<Customer {attrs}>", *_customer_children(values, children_fields), "\t\t</Customer>"]
            counts["C_UPDCUST"] += 1
        elif kind == "CLOSEACCT":
            aid = hist.active_accounts[int(rng.integers(0, len(hist.active_accounts)))]
            cid = hist.people.account_customer[aid]
            hist.close_account(ts, aid)
            body = [f'\t\t<Customer C_ID="{cid}">', f'\t\t\t<Account CA_ID="{aid}" />', "\t\t</Customer>"]
            counts["CA_CLOSEACCT"] += 1
        else:  # INACT
            cid = changed
            hist.inactivate(ts, cid)
            body = [f'\t\t<Customer C_ID="{cid}">', "\t\t</Customer>"]
            counts["C_INACT"] += 1
        lines.extend(_action(kind, ts, body))
    lines.append("</TPCDI:Actions>")
    content = "\r\n".join(lines).encode()  # the official file has no line ending after the root element
    out.write("Batch1/CustomerMgmt.xml", content, n)
    out.write_audit(
        "Batch1/CustomerMgmt_audit.csv",
        [
            AuditRow("DimAccount", 1, "CA_ADDACCT", counts["CA_ADDACCT"]),
            AuditRow("DimAccount", 1, "CA_CLOSEACCT", counts["CA_CLOSEACCT"]),
            AuditRow("DimAccount", 1, "CA_UPDACCT", counts["CA_UPDACCT"]),
            AuditRow("DimAccount", 1, "CA_ID_HIST", -1),
            AuditRow("DimCustomer", 1, "C_NEW", counts["C_NEW"]),
            AuditRow("DimCustomer", 1, "C_UPDCUST", counts["C_UPDCUST"]),
            AuditRow("DimCustomer", 1, "C_ID_HIST", 0),
            AuditRow("DimCustomer", 1, "C_INACT", counts["C_INACT"]),
            AuditRow("DimCustomer", 1, "C_DOB_TO", counts["C_DOB_TO"]),
            AuditRow("DimCustomer", 1, "C_DOB_TY", counts["C_DOB_TY"]),
            AuditRow("DimCustomer", 1, "C_TIER_INV", counts["C_TIER_INV"]),
        ],
    )
    hist.snapshot_keys(1)


def _customer_row(cid: int, values: dict, status: str) -> list[str | None]:
    v = values
    return [str(cid), v["c_tax_id"], status, v["c_l_name"], v["c_f_name"], v["c_m_name"], v["c_gndr"], v["c_tier"],
            v["c_dob"], v["c_adline1"], v["c_adline2"], v["c_zipcode"], v["c_city"], v["c_state_prov"], v["c_ctry"],
            *(v[f"c_{p}_{k}"] for k in (1, 2, 3) for p in ("ctry", "area", "local", "ext")),
            v["c_prim_email"], v["c_alt_email"], v["c_lcl_tx_id"], v["c_nat_tx_id"]]  # fmt: skip


def _incremental(params: Params, out: Output, hist: _History, batch: int) -> None:
    rng = params.rng("Customer", batch)
    start, end = params.window(batch)
    batch_date = params.batch_date(batch)
    n_c, n_a = params.customer_changes, params.account_changes
    pool = profiles(params.rng("Customer", batch, "profiles"), n_c + n_a)
    cust_rows: list[tuple[int, str, list]] = []
    acct_rows: list[tuple[int, str, list]] = []
    counts = dict.fromkeys(("C_NEW", "C_UPDCUST", "C_INACT", "C_DOB_TO", "C_DOB_TY", "C_TIER_INV"), 0)
    acounts = dict.fromkeys(("CA_ADDACCT", "CA_CLOSEACCT", "CA_UPDACCT"), 0)

    def account_row(aid: int) -> list:
        s = hist.account_state[aid]
        customer = str(hist.people.account_customer[aid])
        return [str(aid), s["ca_b_id"], customer, s["ca_name"], s["ca_tax_st"], s["ca_st_id"]]

    # every change of an incremental batch takes effect on its BatchDate: a customer changes once per batch
    day = -batch
    for i, ts in enumerate(np.sort(rng.integers(start, end, n_c))):
        ts = int(ts)
        r = rng.random()
        changed = hist.pick_customer(rng, day) if r >= 0.7 and len(hist.active_customers) >= 2 else None
        if changed is None:
            values = dict(pool[i])
            _bad_values(values, rng, batch_date, None)
            cid = hist.new_customer(ts, values, day)
            cust_rows.append((ts, "I", _customer_row(cid, values, "ACTV")))
            aid = hist.new_account(ts, cid, rng)
            acct_rows.append((ts, "I", account_row(aid)))
            acounts["CA_ADDACCT"] += 1
            counts["C_NEW"] += 1
        elif r < 0.9:
            cid = changed
            values = hist.people.current[cid]
            for f in rng.choice(UPDATABLE, int(rng.integers(1, 5)), replace=False):
                values[str(f)] = pool[i][str(f)]
            _bad_values(values, rng, batch_date, None)
            cust_rows.append((ts, "U", _customer_row(cid, values, "ACTV")))
            counts["C_UPDCUST"] += 1
        else:
            cid = changed
            hist.inactivate(ts, cid)
            cust_rows.append((ts, "U", _customer_row(cid, hist.people.current[cid], "INAC")))
            counts["C_INACT"] += 1
        for alert in _classify(hist.people.current[int(cust_rows[-1][2][0])], batch_date):
            counts[alert] += 1  # every Customer.txt line becomes a DimCustomer version and is checked
    for ts in np.sort(rng.integers(start, end, n_a)):
        ts = int(ts)
        r = rng.random()
        if r < 0.7 or len(hist.active_accounts) < 2:
            cid = hist.active_customers[int(rng.integers(0, len(hist.active_customers)))]
            aid = hist.new_account(ts, cid, rng)
            acct_rows.append((ts, "I", account_row(aid)))
            acounts["CA_ADDACCT"] += 1
        elif r < 0.9:
            aid = hist.active_accounts[int(rng.integers(0, len(hist.active_accounts)))]
            hist.account_state[aid]["ca_b_id"] = str(int(hist.brokers[rng.integers(0, len(hist.brokers))]))
            acct_rows.append((ts, "U", account_row(aid)))
            acounts["CA_UPDACCT"] += 1
        else:
            aid = hist.active_accounts[int(rng.integers(0, len(hist.active_accounts)))]
            hist.close_account(ts, aid)
            acct_rows.append((ts, "U", account_row(aid)))
            acounts["CA_CLOSEACCT"] += 1

    folder = f"Batch{batch}"
    for name, rows in (("Customer", cust_rows), ("Account", acct_rows)):
        rows.sort(key=lambda r: r[0])
        first = out.next_dsn(name)
        lines = [
            "|".join(["I" if flag == "I" else "U", str(first + k), *("" if v is None else v for v in row)])
            for k, (_, flag, row) in enumerate(rows)
        ]
        out.write_lines(f"{folder}/{name}.txt", lines)
    out.write_audit(
        f"{folder}/Customer_audit.csv",
        [
            AuditRow("DimCustomer", batch, "C_NEW", counts["C_NEW"]),
            AuditRow("DimCustomer", batch, "C_UPDCUST", counts["C_UPDCUST"]),
            AuditRow("DimCustomer", batch, "C_ID_HIST", 0),
            AuditRow("DimCustomer", batch, "C_INACT", counts["C_INACT"]),
            AuditRow("DimCustomer", batch, "C_DOB_TO", counts["C_DOB_TO"]),
            AuditRow("DimCustomer", batch, "C_DOB_TY", counts["C_DOB_TY"]),
            AuditRow("DimCustomer", batch, "C_TIER_INV", counts["C_TIER_INV"]),
        ],
    )
    out.write_audit(
        f"{folder}/Account_audit.csv",
        [
            AuditRow("DimAccount", batch, "CA_ADDACCT", acounts["CA_ADDACCT"]),
            AuditRow("DimAccount", batch, "CA_CLOSEACCT", acounts["CA_CLOSEACCT"]),
            AuditRow("DimAccount", batch, "CA_UPDACCT", acounts["CA_UPDACCT"]),
            AuditRow("DimAccount", batch, "CA_ID_HIST", -1),
        ],
    )
    hist.snapshot_keys(batch)


# -------------------------------------------------------------------------------------------- Prospect
def _prospect_table(params: Params, people: People, n_total: int) -> list[np.ndarray]:
    """The 22 Prospect.csv fields for every prospect ever listed; about a quarter copy a customer's name and
    address (the fields DimCustomer matches prospects on), with the last name's case varied as in DIGen."""
    rng = params.rng("Prospect")
    cols = profile_columns(params.rng("Prospect", "profiles"), n_total)
    current = people.current
    matched = np.flatnonzero(rng.random(n_total) < 0.25) if current else np.zeros(0, np.int64)
    source = rng.integers(0, max(len(current), 1), len(matched))
    for name in ("c_l_name", "c_f_name", "c_m_name", "c_adline1", "c_adline2", "c_zipcode", "c_city", "c_state_prov"):
        cols[name][matched] = [current[c][name] for c in source]
    last = cols["c_l_name"]
    case = rng.integers(0, 3, n_total)
    last = np.where(
        case == 1, np.char.upper(last.astype(str)), np.where(case == 2, np.char.lower(last.astype(str)), last)
    )
    agency = [f"{name[:3].upper()}{i}" for i, name in enumerate(cols["c_l_name"].tolist())]

    def ints(low: int, high: int, null_rate: float = 0.0) -> np.ndarray:
        return _maybe(rng, tx.ints(rng.integers(low, high, n_total)).to_pylist(), null_rate)

    parts = zip(ints(200, 999), _digits(rng, n_total, 3), _digits(rng, n_total, 4), strict=True)
    phone = [f"1-{a}-{b}-{c}" for a, b, c in parts]
    return [
        np.asarray(agency, dtype=object),
        last.astype(object),
        cols["c_f_name"],
        cols["c_m_name"],
        _maybe(rng, tx.choice(rng, ("M", "F", "m", "f", "U"), n_total).to_pylist(), 0.1),
        cols["c_adline1"],
        cols["c_adline2"],
        cols["c_zipcode"],
        cols["c_city"],
        cols["c_state_prov"],
        np.asarray(["United States of America" if v is None else v for v in cols["c_ctry"]], dtype=object),
        np.asarray(phone, dtype=object),
        ints(10000, 500000),
        ints(0, 6, 0.05),
        ints(0, 6, 0.05),
        np.asarray(tx.choice(rng, ("S", "M", "D", "W", "U"), n_total).to_pylist(), dtype=object),
        ints(18, 95, 0.05),
        ints(300, 850),
        np.asarray(tx.choice(rng, ("O", "R", "U"), n_total).to_pylist(), dtype=object),
        _maybe(rng, [f"{name} Inc" for name in tx.choice(rng, LAST_NAMES, n_total).to_pylist()], 0.3),
        ints(0, 10, 0.05),
        ints(-100000, 5000000),
    ]


def write_prospects(params: Params, out: Output, people: People) -> None:
    """Prospect.csv in every batch: a full snapshot (earlier prospects plus a few new ones)."""
    per_batch = params.count(6, 1)
    n_total = params.prospects + (params.batches - 1) * per_batch
    table = _prospect_table(params, people, n_total)
    lines = tx.join_fields([pa.array(col.tolist(), pa.string()) for col in table], ",")
    # the match key: upper-cased first name, last name, address lines and postal code
    key_cols = [
        np.char.upper(np.asarray(["" if v is None else v for v in table[i]], dtype=str)) for i in (2, 1, 5, 6, 7)
    ]
    keys = list(zip(*key_cols, strict=True))
    for batch in range(1, params.batches + 1):
        visible = params.prospects + (batch - 1) * per_batch
        known = people.match_keys.get(batch, set())
        matching = sum(1 for key in keys[:visible] if key in known)
        out.write_lines(f"Batch{batch}/Prospect.csv", lines.slice(0, visible))
        out.write_audit(
            f"Batch{batch}/Prospect_audit.csv",
            [
                AuditRow("Prospect", batch, "P_C_MATCHING", matching),
                AuditRow("Prospect", batch, "P_RECORDS", visible),
                AuditRow("Prospect", batch, "P_NEW", visible if batch == 1 else per_batch),
            ],
        )
