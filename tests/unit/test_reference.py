"""T0's pure transforms on hand-written rows: the last delivered row per key, and DimBroker from HR lines."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from jobs.reference import build_brokers, build_reference_table, latest_employees
from schemas import warehouse as wh


def _status_rows(rows: list[tuple[str, str, str, int]]) -> pa.Table:
    return pa.table(
        {
            "st_id": pa.array([r[0] for r in rows], pa.large_string()),
            "st_name": pa.array([r[1] for r in rows], pa.large_string()),
            "source_file": pa.array([r[2] for r in rows], pa.large_string()),
            "line_no": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def test_the_last_file_then_the_last_line_wins():
    staged = _status_rows(
        [
            ("ACTV", "Active", "Batch1/StatusType.txt", 1),
            ("ACTV", "Active again", "Batch1/StatusType.2.txt", 1),
            ("CMPT", "Completed", "Batch1/StatusType.txt", 2),
            ("CMPT", "Completed (late line)", "Batch1/StatusType.txt", 5),
            ("PNDG", "Pending", "Batch1/StatusType.2.txt", 2),
            ("PNDG", "Pending (unknown file)", "Batch1/Other.txt", 9),
        ]
    )
    file_seq = {"Batch1/StatusType.txt": 0, "Batch1/StatusType.2.txt": 1}
    out = build_reference_table(staged, wh.STATUS_TYPE, file_seq)
    assert sorted(out.to_pylist(), key=lambda r: r["st_id"]) == [
        {"st_id": "ACTV", "st_name": "Active again"},
        {"st_id": "CMPT", "st_name": "Completed (late line)"},
        {"st_id": "PNDG", "st_name": "Pending"},
    ]


def _hr(rows: list[tuple[int, int, str, int, int, str, int]]) -> pa.Table:
    """(employee id, job code, first name, batch id, line, file, manager id) -> staged HR lines."""
    return pa.table(
        {
            "employeeid": pa.array([r[0] for r in rows], pa.int64()),
            "managerid": pa.array([r[6] for r in rows], pa.int64()),
            "employeefirstname": pa.array([r[2] for r in rows], pa.large_string()),
            "employeelastname": pa.array(["Lee"] * len(rows), pa.large_string()),
            "employeemi": pa.array([None] * len(rows), pa.large_string()),
            "employeejobcode": pa.array([r[1] for r in rows], pa.int32()),
            "employeebranch": pa.array(["Main"] * len(rows), pa.large_string()),
            "employeeoffice": pa.array(["A1"] * len(rows), pa.large_string()),
            "employeephone": pa.array(["(555) 123-4567"] * len(rows), pa.large_string()),
            "batch_id": pa.array([r[3] for r in rows], pa.int64()),
            "source_file": pa.array([r[5] for r in rows], pa.large_string()),
            "line_no": pa.array([r[4] for r in rows], pa.int64()),
        }
    )


def test_brokers_are_the_latest_line_of_each_employee_with_job_code_314():
    hr = _hr(
        [
            (7, 314, "Ann", 1, 3, "Batch1/HR.csv", 1),
            (7, 314, "Anne", 2, 1, "Batch1/HR.csv", 1),  # a later micro-batch redelivered her line
            (8, 314, "Bob", 1, 4, "Batch1/HR.csv", 1),
            (8, 200, "Bob", 1, 9, "Batch1/HR.csv", 1),  # his last line is not a broker's
            (9, None, "Cy", 1, 5, "Batch1/HR.csv", 1),  # no job code: not a broker
            (10, 314, "Di", 1, 6, "Batch1/HR.csv", 2),
        ]
    )
    brokers = build_brokers(latest_employees(hr, {"Batch1/HR.csv": 0}), dt.date(1950, 1, 1))
    got = sorted(brokers.to_pylist(), key=lambda r: r["brokerid"])
    # 1950-01-01 is day 18262 after 1900-01-01: sk = employee id * 100000 + 18262
    assert [(r["sk_brokerid"], r["brokerid"], r["firstname"], r["managerid"]) for r in got] == [
        (718262, 7, "Anne", 1),
        (1018262, 10, "Di", 2),
    ]
    assert {(r["iscurrent"], r["batchid"], r["effectivedate"], r["enddate"]) for r in got} == {
        (True, 1, dt.date(1950, 1, 1), dt.date(9999, 12, 31))
    }
