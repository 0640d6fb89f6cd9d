"""Readable builders for test input, from the declared schemas.

`source_line(TAX_RATE, tx_id="US9")` gives one line of TaxRate.txt in the official format, with every field
not named taken from `DEFAULTS` (a valid value), so a test says only what matters to it.
"""

from __future__ import annotations

import datetime as dt
import os
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from schemas import sources as src
from schemas.model import SourceFile

# Scale of the `slow` tests: the default keeps the whole suite inside CI's time budget; `STREAMDI_TEST_SCALE=full`
# runs the figures the acceptance criteria name (e.g. 50 micro-batches, every crash seed). See docs/testing.md.
FULL_SCALE = os.environ.get("STREAMDI_TEST_SCALE", "").strip().lower() == "full"


def at_scale(default, full):
    """`full` under `STREAMDI_TEST_SCALE=full`, else `default`."""
    return full if FULL_SCALE else default


# Files cut from a real run of the official TPC-DI generator (read-only; never modified).
SHARED_SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "tpcdi-sample"

DEFAULTS: dict[str, dict[str, str]] = {
    "StatusType": {"st_id": "ACTV", "st_name": "Active"},
    "TradeType": {"tt_id": "TMB", "tt_name": "Market Buy", "tt_is_sell": "0", "tt_is_mrkt": "1"},
    "Industry": {"in_id": "AM", "in_name": "Aerospace & Defense", "in_sc_id": "CG"},
    "TaxRate": {"tx_id": "US1", "tx_name": "Bracket one", "tx_rate": "0.15000"},
    "BatchDate": {"batchdate": "2017-07-15"},
    "Trade": dict(
        zip(
            [c.name for c in src.TRADE.columns],
            "1|2017-07-03 09:30:00|CMPT|TMB|1|AAAA|100|20.00|7|Broker Name|20.10|1.00|2.00|0.50".split("|"),
            strict=True,
        )
    ),
    "Date": dict(
        zip(
            [c.name for c in src.DATE_FILE.columns],
            "20170704|2017-07-04|Jul 4, 2017|2017|2017|20173|2017 Q3|20177|2017 Jul|201727|2017-W27|2|Tue|2018|2018"
            "|20181|2018 Q1|true".split("|"),
            strict=True,
        )
    ),
    "Time": dict(
        zip(
            [c.name for c in src.TIME_FILE.columns],
            "093000|09:30:00|09|09|30|09:30|00|09:30:00|true|true".split("|"),
            strict=True,
        )
    ),
}


def source_line(source: SourceFile, **fields: str) -> str:
    """One line of `source` with the named fields set and the rest from DEFAULTS (None -> empty field)."""
    unknown = set(fields) - {c.name for c in source.columns}
    if unknown:
        raise KeyError(f"{source.name} has no fields {sorted(unknown)}")
    values = {**DEFAULTS[source.name], **fields}
    return source.delimiter.join("" if values[c.name] is None else values[c.name] for c in source.columns)


def staged_trades(*rows: tuple[int, str, int, str], batch: int = 1) -> pa.Table:
    """Staged Trade rows of `batch`'s Trade.txt: (t_id, t_st_id, t_qty, t_bid_price); every other column from a
    valid trade."""
    out = []
    for n, (t_id, status, qty, price) in enumerate(rows, start=1):
        out.append(
            {
                "t_id": t_id,
                "t_dts": dt.datetime(2017, 7, 1, 9, 30, tzinfo=dt.UTC),
                "t_st_id": status,
                "t_tt_id": "TMB",
                "t_is_cash": True,
                "t_s_symb": "AAAA",
                "t_qty": qty,
                "t_bid_price": Decimal(price),
                "t_ca_id": 7,
                "t_exec_name": "Broker",
                "t_trade_price": None,
                "t_chrg": None,
                "t_comm": None,
                "t_tax": None,
                "batch_id": batch,
                "source_file": f"Batch{batch}/Trade.txt",
                "line_no": n,
                "source_batch": batch,
            }
        )
    return pa.Table.from_pylist(out, schema=src.TRADE.staging.arrow_schema())


def write_landing_file(path: Path, lines: list[str], crlf: bool = True) -> Path:
    """Write lines like the official generator does (CRLF line endings by default)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ending = "\r\n" if crlf else "\n"
    path.write_bytes("".join(line + ending for line in lines).encode())
    return path


def deliver(landing: Path, relative: str, content: bytes, arrived_at: datetime) -> Path:
    """Write a landing file and set its modification time (the collector's arrival time) to `arrived_at`."""
    path = landing / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    os.utime(path, (arrived_at.timestamp(), arrived_at.timestamp()))
    return path


def trim_calendar(data_dir: Path, lines: int = 400) -> None:
    """Cut a generated data set's Batch1 Date.txt and Time.txt to their first `lines` lines.

    They are fixed-size (25,933 days, 86,400 seconds) whatever the scale factor, and nothing but DimDate/DimTime
    and DimBroker's effective date (the first day) reads them; tests of the dataflow that do not audit the
    calendar use a short one to stay fast.
    """
    for name in ("Date.txt", "Time.txt"):
        path = data_dir / "Batch1" / name
        kept = path.read_bytes().split(b"\r\n")[:lines]
        path.write_bytes(b"\r\n".join(kept) + b"\r\n")


def suites_in(tmp_path: Path, **files: str) -> Path:
    """An expectations folder of hand-written suites: `suites_in(tmp, staging__trade="table: ...")` writes
    `expectations/staging/trade.yml`; returns the folder, for `quality.load_suites(root)`."""
    root = tmp_path / "expectations"
    for name, text in files.items():
        layer, table = name.split("__")
        (root / layer).mkdir(parents=True, exist_ok=True)
        (root / layer / f"{table}.yml").write_text(text)
    return root
