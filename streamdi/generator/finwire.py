"""FINWIRE: quarterly files of company (CMP), security (SEC) and financial (FIN) records, fixed width.

Model: companies are founded over 1967Q1..2017Q2 (a batch of them in the first quarter), some are updated
later (new CEO, address or S&P rating; a few ratings are invalid, to raise the DImessages alert); securities
are issued by a company that exists at the security's posting time and refer to it by name or by CIK
(half each); every company posts one FIN record in every quarter after the one it was founded in. Company
names never change, so a SEC or FIN reference by name always resolves. All securities are issued before
trading starts (2012-07-07), so every traded symbol exists in DimSecurity at trade time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas import finwire as fw
from streamdi.generator import text as tx
from streamdi.generator.output import AuditRow, Output
from streamdi.generator.params import FINWIRE_FIRST_QUARTER, FINWIRE_LAST_QUARTER, HISTORY_BEGIN, Params
from streamdi.generator.reference import LAST_NAMES, industry_ids

SP_RATINGS = ("AAA", "AA+", "AA", "AA-", "A+", "A", "A-", "BBB+", "BBB", "BBB-", "BB+", "BB", "BB-", "B+", "B", "B-",
              "CCC+", "CCC", "CCC-", "CC", "C", "D")  # fmt: skip
BAD_SP_RATINGS = ("ZZ", "XX+", "AAAA")
ISSUE_TYPES = ("COMMON", "PREF_A", "PREF_B", "PREF_C", "PREF_D")
EXCHANGES = ("NYSE", "NASDAQ", "AMEX", "PCX")
CITIES = ("Long Beach", "Atlanta", "Syracuse", "Columbus", "Inglewood", "Berkeley", "Toronto", "Fairbanks")
STATES = ("NC", "CA", "NY", "TX", "Ontario", "Nova Scotia", "Alberta", "WA")
COUNTRIES = ("United States of America", "Canada")
BAD_RATING_RATE = 0.02
UPDATES_PER_COMPANY = 0.3


def quarter_count() -> int:
    (y0, q0), (y1, q1) = FINWIRE_FIRST_QUARTER, FINWIRE_LAST_QUARTER
    return (y1 - y0) * 4 + (q1 - q0) + 1


def quarter_starts() -> np.ndarray:
    """Epoch seconds of the first instant of every FINWIRE quarter, plus the end of the last one."""
    y0, q0 = FINWIRE_FIRST_QUARTER
    first = np.datetime64(f"{y0}-{3 * (q0 - 1) + 1:02d}", "M")
    months = first + 3 * np.arange(quarter_count() + 1)
    return months.astype("datetime64[s]").astype(np.int64)


def quarter_name(index: int) -> str:
    y0, q0 = FINWIRE_FIRST_QUARTER
    k = (q0 - 1) + index
    return f"{y0 + k // 4}Q{k % 4 + 1}"


def symbols(n: int) -> np.ndarray:
    """AAAAAAAAAAAAAAA, AAAAAAAAAAAAAAB, ... (15 letters, base 26), as the official symbols look."""
    digits = np.zeros((n, 15), dtype=np.uint8)
    rest = np.arange(n)
    for pos in range(14, -1, -1):
        digits[:, pos] = rest % 26
        rest = rest // 26
    return (digits + ord("A")).view("S15").ravel().astype(str)


@dataclass
class Finwire:
    """What the rest of the generator needs to know about companies and securities."""

    company_names: np.ndarray
    company_created: np.ndarray  # epoch seconds of the first CMP record
    symbols: np.ndarray
    security_created: np.ndarray


def _fixed(record: fw.FixedWidthRecord, values: dict[str, pa.Array], n: int, short_last: np.ndarray | None) -> pa.Array:
    parts = []
    for f in record.fields:
        col = values[f.name]
        padded = tx.pad(col, f.width, f.align)
        if f is record.fields[-1] and short_last is not None:
            padded = pc.if_else(
                pa.array(short_last), pc.utf8_slice_codeunits(padded, 0, record.short_last_field), padded
            )
        parts.append(padded)
    return pc.binary_join_element_wise(*parts, "")


def _cik(ids: np.ndarray) -> pa.Array:
    return tx.zero_padded(ids, 10)


def generate(params: Params, out: Output, batch_dir: str) -> Finwire:
    rng = params.rng("FINWIRE")
    starts = quarter_starts()
    n_q = quarter_count()
    first_trade = int(np.datetime64(HISTORY_BEGIN.isoformat(), "s").astype(np.int64))
    industries = industry_ids()

    # companies: founded in 1967Q1 (6%, at least one) or uniformly later; CIK = index in founding order
    n_c = params.companies
    early = rng.random(n_c) < 0.06
    early[0] = True
    created = np.where(
        early, rng.integers(starts[0], starts[1], n_c), rng.integers(starts[1], first_trade - 86400 * 30, n_c)
    )
    created = np.sort(created)
    names = tx.random_text(rng, n_c, 20, 60)
    industry = np.asarray(industries)[rng.integers(0, len(industries), n_c)]
    founded_days = rng.integers(-365 * 150, -365, n_c) + created // 86400

    # CMP records: one at founding, then updates at later times
    n_updates = rng.poisson(UPDATES_PER_COMPANY, n_c)
    upd_company = np.repeat(np.arange(n_c), n_updates)
    upd_time = created[upd_company] + (rng.random(len(upd_company)) * (starts[-1] - created[upd_company])).astype(
        np.int64
    )
    cmp_company = np.concatenate([np.arange(n_c), upd_company])
    cmp_time = np.concatenate([created, upd_time])
    m = len(cmp_company)
    ratings = np.asarray(SP_RATINGS)[rng.integers(0, len(SP_RATINGS), m)]
    bad = rng.random(m) < BAD_RATING_RATE
    ratings = np.where(bad, np.asarray(BAD_SP_RATINGS)[rng.integers(0, len(BAD_SP_RATINGS), m)], ratings)
    status = np.where((np.arange(m) >= n_c) & (rng.random(m) < 0.05), "INAC", "ACTV")
    cmp_values = {
        "pts": tx.timestamps(cmp_time, fw.POSTED_FORMAT),
        "rec_type": pa.array(["CMP"] * m),
        "company_name": names.take(pa.array(cmp_company)),
        "cik": _cik(cmp_company),
        "status": pa.array(status),
        "industry_id": pa.array(industry[cmp_company]),
        "sp_rating": pa.array(ratings),
        "founding_date": tx.nullify(tx.dates(founded_days[cmp_company], fw.DATE_FORMAT), rng.random(m) < 0.05),
        "addr_line1": pc.binary_join_element_wise(
            tx.ints(rng.integers(1, 30000, m)), tx.choice(rng, LAST_NAMES, m), " "
        ),
        "addr_line2": tx.nullify(
            pc.binary_join_element_wise(pa.array(["Apt."] * m), tx.ints(rng.integers(1, 999, m)), " "),
            rng.random(m) < 0.8,
        ),
        "postal_code": tx.ints(rng.integers(10000, 99999, m)),
        "city": tx.choice(rng, CITIES, m),
        "state_province": tx.choice(rng, STATES, m),
        "country": tx.nullify(tx.choice(rng, COUNTRIES, m), rng.random(m) < 0.05),
        "ceo_name": tx.choice(rng, LAST_NAMES, m),
        "description": tx.random_text(rng, m, 20, 150),
    }
    cmp_lines = _fixed(fw.CMP, cmp_values, m, None)

    # securities: issued by an existing company, before trading starts
    n_s = params.securities
    issuer = rng.integers(0, n_c, n_s)
    sec_time = created[issuer] + (rng.random(n_s) * (first_trade - 86400 - created[issuer])).astype(np.int64)
    order = np.argsort(sec_time, kind="stable")
    issuer, sec_time = issuer[order], sec_time[order]
    syms = symbols(n_s)
    by_cik = rng.random(n_s) < 0.5
    first_trade_days = sec_time // 86400 - rng.integers(0, 365 * 40, n_s)
    sec_values = {
        "pts": tx.timestamps(sec_time, fw.POSTED_FORMAT),
        "rec_type": pa.array(["SEC"] * n_s),
        "symbol": pa.array(syms),
        "issue_type": tx.choice(rng, ISSUE_TYPES, n_s),
        "status": pa.array(["ACTV"] * n_s),
        "name": tx.random_text(rng, n_s, 10, 70),
        "ex_id": tx.choice(rng, EXCHANGES, n_s),
        "sh_out": tx.ints(rng.integers(10**6, 10**9, n_s)),
        "first_trade_date": tx.dates(first_trade_days, fw.DATE_FORMAT),
        "first_trade_exchg": tx.dates(first_trade_days + rng.integers(0, 3650, n_s), fw.DATE_FORMAT),
        "dividend": tx.money(rng.integers(0, 500, n_s)),
        "co_name_or_cik": pc.if_else(pa.array(by_cik), _cik(issuer), names.take(pa.array(issuer))),
    }
    sec_lines = _fixed(fw.SEC, sec_values, n_s, by_cik)

    # FIN: every company, every quarter after the one it was founded in
    first_q = np.searchsorted(starts, created, side="right")  # index of the quarter after founding
    per_company = np.maximum(n_q - first_q, 0)
    fin_company = np.repeat(np.arange(n_c), per_company)
    offsets = np.arange(len(fin_company)) - np.repeat(np.cumsum(per_company) - per_company, per_company)
    fin_q = first_q[fin_company] + offsets
    f = len(fin_company)
    q_len = starts[fin_q + 1] - starts[fin_q]
    fin_time = starts[fin_q] + (rng.random(f) * q_len).astype(np.int64)
    y0, q0 = FINWIRE_FIRST_QUARTER
    k = q0 - 1 + fin_q
    revenue = rng.integers(10**8, 10**12, f)
    earnings = (revenue * rng.uniform(-0.1, 0.5, f)).astype(np.int64)
    shares = rng.integers(10**7, 10**9, f)
    diluted_shares = shares + shares // 20
    eps = earnings // shares  # cents per share, so EPS = net earnings / shares outstanding as the audit checks
    fin_by_cik = rng.random(f) < 0.5
    fin_values = {
        "pts": tx.timestamps(fin_time, fw.POSTED_FORMAT),
        "rec_type": pa.array(["FIN"] * f),
        "year": tx.ints(y0 + k // 4),
        "quarter": tx.ints(k % 4 + 1),
        "qtr_start_date": tx.dates(starts[fin_q] // 86400, fw.DATE_FORMAT),
        "posting_date": tx.dates(fin_time // 86400, fw.DATE_FORMAT),
        "revenue": tx.money(revenue),
        "earnings": tx.money(earnings),
        "eps": tx.money(eps),
        "diluted_eps": tx.money(earnings // diluted_shares),
        "margin": tx.money(np.round(earnings * 100 / revenue).astype(np.int64)),  # net earnings / revenue
        "inventory": tx.money(rng.integers(0, 10**11, f)),
        "assets": tx.money(rng.integers(10**8, 10**14, f)),
        "liabilities": tx.money(rng.integers(10**7, 10**12, f)),
        "sh_out": tx.ints(shares),
        "diluted_sh_out": tx.ints(diluted_shares),
        "co_name_or_cik": pc.if_else(pa.array(fin_by_cik), _cik(fin_company), names.take(pa.array(fin_company))),
    }
    fin_lines = _fixed(fw.FIN, fin_values, f, fin_by_cik)

    # one file per quarter, records in posting order (CMP before SEC before FIN at the same second)
    lines = pa.concat_arrays([cmp_lines, sec_lines, fin_lines])
    times = np.concatenate([cmp_time, sec_time, fin_time])
    kind = np.concatenate([np.zeros(m, np.int8), np.ones(n_s, np.int8), np.full(f, 2, np.int8)])
    quarter = np.searchsorted(starts, times, side="right") - 1
    order = np.lexsort((np.arange(len(times)), kind, times))
    quarter, kind = quarter[order], kind[order]
    lines = lines.take(pa.array(order))
    bounds = np.searchsorted(quarter, np.arange(n_q + 1))
    for qi in range(n_q):
        lo, hi = int(bounds[qi]), int(bounds[qi + 1])
        name = f"FINWIRE{quarter_name(qi)}"
        out.write_lines(f"{batch_dir}/{name}", lines.slice(lo, hi - lo))
        counts = np.bincount(kind[lo:hi], minlength=3)
        out.write_audit(
            f"{batch_dir}/{name}_audit.csv",
            [
                AuditRow("DimSecurity", 1, "FW_SEC", int(counts[1])),
                AuditRow("DimSecurity", 1, "FW_SEC_DUP", -1),
                AuditRow("DimCompany", 1, "FW_CMP", int(counts[0])),
                AuditRow("DimCompany", 1, "FW_CMP_DUP", -1),
                AuditRow("Financial", 1, "FW_FIN", int(counts[2])),
                AuditRow("Financial", 1, "FW_FIN_DUP", -1),
            ],
        )
    return Finwire(np.asarray(names.to_pylist(), dtype=object), created, syms, sec_time)
