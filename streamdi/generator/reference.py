"""Batch1 reference files: StatusType, TradeType, Industry, TaxRate (fixed), Date and Time (calendar), HR.csv.

Date.txt rules (documented differences from the official file in docs/generator.md): weeks start on Sunday
and week 1 holds January 1st; the fiscal year runs July-June and is named by the calendar year it ends in;
holidays are January 1st, July 4th and December 25th. Time.txt: market hours 09:30-15:59:59, office hours
09:00-16:59:59.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamdi.generator import reference_data as ref
from streamdi.generator import text as tx
from streamdi.generator.output import AuditRow, Output
from streamdi.generator.params import DATE_BEGIN, DATE_END, Params

BROKER_JOB_CODE = 314
OTHER_JOB_CODES = (534, 535, 536, 537, 647, 648, 649)

FIRST_NAMES = (
    "Adara", "Jirina", "Mariam", "Tandie", "Lynna", "Zarla", "Netti", "Trudy", "Candice", "Jami", "Douglas",
    "Marcus", "Elena", "Hiroshi", "Priya", "Oskar", "Fatima", "Liam", "Noor", "Mateo", "Ingrid", "Kwame",
    "Sofia", "Arjun", "Chloe", "Dmitri", "Amara", "Felix", "Yara", "Tobias", "Leila", "Rafael",
)  # fmt: skip
LAST_NAMES = (
    "Joannis", "Paperno", "McBryan", "Kempffer", "Shostak", "Dimarzo", "Pelland", "Leduc", "Latif", "Ozkan",
    "Suer", "Somisetty", "Ellebracht", "Schrupp", "Luttman", "Okafor", "Lindqvist", "Nakamura", "Moreau",
    "Castillo", "Brennan", "Kowalski", "Haddad", "Petrov", "Sorensen", "Achebe", "Varga", "Quintero",
    "Whitfield", "Tanaka", "Novak", "Ferreira",
)  # fmt: skip
MONTHS = np.array(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], dtype=object)
WEEKDAYS = np.array(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], dtype=object)


def write_static(out: Output, batch_dir: str) -> None:
    for name, lines in (
        ("StatusType", ref.STATUSTYPE_LINES),
        ("TradeType", ref.TRADETYPE_LINES),
        ("Industry", ref.INDUSTRY_LINES),
        ("TaxRate", ref.TAXRATE_LINES),
    ):
        out.write_lines(f"{batch_dir}/{name}.txt", list(lines))
        out.write_audit(f"{batch_dir}/{name}_audit.csv", [])


def industry_ids() -> tuple[str, ...]:
    return tuple(line.split("|", 1)[0] for line in ref.INDUSTRY_LINES)


def date_lines() -> pa.Array:
    days = np.arange(np.datetime64(DATE_BEGIN.isoformat()), np.datetime64(DATE_END.isoformat()) + 1)
    ymd = days.astype("datetime64[D]")
    year = ymd.astype("datetime64[Y]").astype(int) + 1970
    month = ymd.astype("datetime64[M]").astype(int) % 12 + 1
    day = (ymd - ymd.astype("datetime64[M]")).astype(int) + 1
    weekday = (days.astype(int) + 3) % 7  # 1970-01-01 was a Thursday; 0 = Monday
    doy = (ymd - ymd.astype("datetime64[Y]")).astype(int)
    jan1_weekday = (ymd.astype("datetime64[Y]").astype("datetime64[D]").astype(int) + 3) % 7
    week = (doy + (jan1_weekday + 1) % 7) // 7 + 1  # weeks start on Sunday
    quarter = (month - 1) // 3 + 1
    fiscal_year = np.where(month >= 7, year + 1, year)
    fiscal_quarter = ((month - 7) % 12) // 3 + 1
    holiday = day == 1
    y = tx.ints(year)
    cols = [
        tx.ints(year * 10000 + month * 100 + day),
        tx.dates(days.astype(int)),
        pc.binary_join_element_wise(
            pa.array(MONTHS[month - 1]), pc.binary_join_element_wise(tx.ints(day), y, ", "), " "
        ),
        y,
        y,
        tx.ints(year * 10 + quarter),
        pc.binary_join_element_wise(
            y, pc.binary_join_element_wise(pa.array(["Q"] * len(days)), tx.ints(quarter), ""), " "
        ),
        pc.binary_join_element_wise(y, tx.ints(month), ""),
        pc.binary_join_element_wise(y, pa.array(MONTHS[month - 1]), " "),
        pc.binary_join_element_wise(y, tx.ints(week), ""),
        pc.binary_join_element_wise(y, tx.ints(week), "-W"),
        tx.ints(weekday + 1),
        pa.array(WEEKDAYS[weekday]),
        tx.ints(fiscal_year),
        tx.ints(fiscal_year),
        tx.ints(fiscal_year * 10 + fiscal_quarter),
        pc.binary_join_element_wise(tx.ints(fiscal_year), tx.ints(fiscal_quarter), " Q"),
        pa.array(np.where(holiday, "true", "false")),
    ]
    return tx.join_fields(cols, "|")


def time_lines() -> pa.Array:
    second_of_day = np.arange(86400)
    h, m, s = second_of_day // 3600, second_of_day // 60 % 60, second_of_day % 60
    hh, mm, ss = tx.zero_padded(h, 2), tx.zero_padded(m, 2), tx.zero_padded(s, 2)
    hhmm = pc.binary_join_element_wise(hh, mm, ":")
    hhmmss = pc.binary_join_element_wise(hhmm, ss, ":")
    market = (second_of_day >= 9 * 3600 + 1800) & (second_of_day < 16 * 3600)
    office = (second_of_day >= 9 * 3600) & (second_of_day < 17 * 3600)
    cols = [
        pc.binary_join_element_wise(hh, mm, ss, ""),
        hhmmss,
        hh,
        hh,
        mm,
        hhmm,
        ss,
        hhmmss,
        pa.array(np.where(market, "true", "false")),
        pa.array(np.where(office, "true", "false")),
    ]
    return tx.join_fields(cols, "|")


def write_calendar(out: Output, batch_dir: str) -> None:
    out.write_lines(f"{batch_dir}/Date.txt", date_lines())
    out.write_audit(f"{batch_dir}/Date_audit.csv", [])
    out.write_lines(f"{batch_dir}/Time.txt", time_lines())
    out.write_audit(f"{batch_dir}/Time_audit.csv", [])


def phones(rng: np.random.Generator, n: int) -> pa.Array:
    area, a, b = rng.integers(200, 1000, n), rng.integers(0, 1000, n), rng.integers(0, 10000, n)
    return pc.binary_join_element_wise(
        pc.binary_join_element_wise(pa.array(["("] * n), tx.zero_padded(area, 3), ""),
        pc.binary_join_element_wise(tx.zero_padded(a, 3), tx.zero_padded(b, 4), "-"),
        ") ",
    )


def generate_hr(params: Params) -> dict[str, np.ndarray]:
    """The employees: ids 0..n-1, managers, job codes (30% brokers, at least one)."""
    rng = params.rng("HR")
    n = params.employees
    job = np.where(rng.random(n) < 0.3, BROKER_JOB_CODE, np.asarray(OTHER_JOB_CODES)[rng.integers(0, 7, n)])
    if not (job == BROKER_JOB_CODE).any():
        job[0] = BROKER_JOB_CODE
    return {"id": np.arange(n), "manager": rng.integers(0, n, n), "job": job}


def write_hr(out: Output, params: Params, hr: dict[str, np.ndarray], batch_dir: str) -> None:
    rng = params.rng("HR", "text")
    n = len(hr["id"])
    cols = [
        tx.ints(hr["id"]),
        tx.ints(hr["manager"]),
        tx.choice(rng, FIRST_NAMES, n),
        tx.choice(rng, LAST_NAMES, n),
        tx.nullify(pa.array(tx.LETTERS[rng.integers(0, 26, n)].view("S1").astype(str)), rng.random(n) < 0.5),
        tx.ints(hr["job"], (hr["job"] == BROKER_JOB_CODE) | (rng.random(n) >= 0.02)),  # brokers keep theirs
        tx.nullify(tx.random_text(rng, n, 10, 30), rng.random(n) < 0.05),
        tx.nullify(pc.binary_join_element_wise(pa.array(["OFFICE"] * n), tx.ints(rng.integers(1, 10000, n)), ""),
                   rng.random(n) < 0.05),
        tx.nullify(phones(rng, n), rng.random(n) < 0.05),
    ]  # fmt: skip
    out.write_lines(f"{batch_dir}/HR.csv", tx.join_fields(cols, ","))
    brokers = int((hr["job"] == BROKER_JOB_CODE).sum())
    out.write_audit(f"{batch_dir}/HR_audit.csv", [AuditRow("DimBroker", 1, "HR_BROKERS", brokers)])
