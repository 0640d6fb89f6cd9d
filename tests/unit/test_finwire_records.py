"""Why a FINWIRE record cannot be loaded (`jobs.finwire_records`): the first failing check per record, its detail
made only for the records that fail, and the NOT NULL columns a record leaves empty."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from jobs.finwire_records import MISSING_FIELD, UNKNOWN_COMPANY, UNKNOWN_STATUS, first_reason, missing_required
from schemas import warehouse as wh


def test_the_first_failing_check_gives_the_reason_and_only_failing_records_get_details():
    asked: list[list[int]] = []

    def company_detail(at: np.ndarray) -> pa.Array:
        asked.append(at.tolist())
        return pa.array([f"CO_NAME_OR_CIK = c{i}" for i in at.tolist()])

    status = pa.array([True, False, None, False, True, False])  # record 2's NULL condition does not fail
    missing = pa.array(["", "fi_year", "", "", "fi_qtr", ""])
    unknown = pa.array([False, True, True, False, True, False])
    reason, detail = first_reason(
        6,
        (status, UNKNOWN_STATUS, pa.array([f"ST_ID = s{i}" for i in range(6)])),
        (pa.array([m != "" for m in missing.to_pylist()]), MISSING_FIELD, lambda at: missing.take(at)),
        (unknown, UNKNOWN_COMPANY, company_detail),
    )
    assert reason.to_pylist() == [UNKNOWN_STATUS, MISSING_FIELD, UNKNOWN_COMPANY, None, UNKNOWN_STATUS, None]
    assert detail.to_pylist() == ["ST_ID = s0", "fi_year", "CO_NAME_OR_CIK = c2", None, "ST_ID = s4", None]
    assert asked == [[2]]  # records 1 and 4 failed an earlier check; 3 and 5 none

    reason, detail = first_reason(3, (pa.array([False, None, False]), UNKNOWN_STATUS, company_detail))
    assert reason.to_pylist() == detail.to_pylist() == [None, None, None] and asked == [[2]]


def test_missing_required_lists_the_empty_not_null_columns_of_each_record():
    rows = pa.table(
        {
            "fi_year": pa.array([2017, None, None, 2018], pa.int32()),
            "fi_qtr": pa.array([1, 2, None, 3], pa.int32()),
            "fi_revenue": pa.array([None, None, None, 1.0]),
        }
    )
    assert [wh.FINANCIAL.column(c).nullable for c in rows.column_names] == [False, False, False]
    assert missing_required(wh.FINANCIAL, rows, tuple(rows.column_names)).to_pylist() == [
        "fi_revenue",
        "fi_year,fi_revenue",
        "fi_year,fi_qtr,fi_revenue",
        "",
    ]
