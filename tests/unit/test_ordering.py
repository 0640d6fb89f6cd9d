"""Ordering contracts (schemas/ordering.py) and their checks (jobs/ordering.py) on hand-written file names and rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from jobs.ordering import Part, check_staged, missing_predecessors, order_violations, part_of
from schemas import sources as src
from schemas.ordering import BAG, BY_CDC_DSN, CONTRACTS, Ordering, contract_for
from streamdi.parts import parts_of


def test_every_delimited_source_declares_its_order():
    assert set(CONTRACTS) == {s.name for s in src.ALL_SOURCES}
    assert contract_for("Trade_CDC") == BY_CDC_DSN and contract_for("Customer") == BY_CDC_DSN
    assert contract_for("Prospect") == BAG and contract_for("Trade") == BAG and contract_for("BatchDate") == BAG
    with pytest.raises(ValueError):
        Ordering("total")
    with pytest.raises(KeyError, match="no ordering contract"):
        contract_for("Nothing")


def test_part_names():
    assert part_of("Trade_batch2_0003.txt") == Part("", "trade", 2, 3)
    assert part_of("crm/Customer_batch2_0001_dup.txt") == Part("crm", "customer", 2, 1)
    assert part_of("Prospect_batch3_0000.csv") == Part("", "prospect", 3, 0)
    assert part_of("Batch2/Trade.txt") is None and part_of("Batch2/Customer_2.txt") is None
    assert Part("", "trade", 2, 0).predecessor() is None
    assert Part("a", "trade", 2, 5).predecessor() == Part("a", "trade", 2, 4)


def test_missing_predecessors_per_source_batch_and_channel():
    known = ["Trade_batch2_0000.txt", "Trade_batch2_0001.txt", "crm/Customer_batch2_0000.txt", "Trade_batch3_0000.txt"]
    files = [
        "Trade_batch2_0002.txt",  # after 0001: fine
        "Trade_batch2_0004.txt",  # 0003 missing
        "Trade_batch3_0001.txt",  # fine (batch 3 has its own numbering)
        "crm/Customer_batch2_0001.txt",  # fine
        "Customer_batch2_0001.txt",  # another channel: its 0000 is missing
        "Batch2/Account.txt",  # a whole file
        "WatchHistory_batch2_0000.txt",  # a first part
    ]
    assert missing_predecessors(files, parts_of([*known, *files])) == {
        "Trade_batch2_0004.txt": "trade_batch2_0003",
        "Customer_batch2_0001.txt": "customer_batch2_0000",
    }


def rows(*records: tuple[str, int, int]) -> pa.Table:
    return pa.Table.from_pylist([{"source_file": f, "line_no": n, "cdc_dsn": k} for f, n, k in records])


def test_keys_must_increase_across_parts_in_part_order_whatever_the_arrival():
    # part 1 arrived (and was staged) before part 0: both in order by key -> nothing to report
    assert (
        order_violations(
            rows(("T_batch2_0000.txt", 1, 10), ("T_batch2_0000.txt", 2, 11)),
            "cdc_dsn",
            rows(("T_batch2_0001.txt", 1, 12)),
        )
        == []
    )
    # a key going backwards inside a part, and a part whose keys are not above its predecessor's
    found = order_violations(
        rows(("T_batch2_0001.txt", 1, 30), ("T_batch2_0001.txt", 2, 25), ("T_batch2_0002.txt", 1, 29)), "cdc_dsn"
    )
    assert [v.describe() for v in found] == [
        "T_batch2_0001.txt line 2: 25 is not above 30 (T_batch2_0001.txt line 1)",
        "T_batch2_0002.txt line 1: 29 is not above 30 (T_batch2_0001.txt line 1)",
    ]
    # a late predecessor whose keys are above its (already staged) successor's: reported on the new rows' side
    late = order_violations(rows(("T_batch2_0000.txt", 1, 50)), "cdc_dsn", rows(("T_batch2_0001.txt", 1, 12)))
    assert [(v.file, v.after_file) for v in late] == [("T_batch2_0001.txt", "T_batch2_0000.txt")]
    # whole files are groups of their own; other TPC-DI batches and channels too
    assert (
        order_violations(
            rows(
                ("Batch2/C.txt", 1, 9),
                ("Batch2/C_2.txt", 1, 3),
                ("C_batch3_0001.txt", 1, 1),
                ("x/C_batch2_0001.txt", 1, 2),
            ),
            "cdc_dsn",
        )
        == []
    )
    # equal keys break a total order
    assert len(order_violations(rows(("T_batch2_0000.txt", 1, 7), ("T_batch2_0000.txt", 2, 7)), "cdc_dsn")) == 1


def test_check_staged_outcomes_and_policies():
    from schemas.sources import TRADE_CDC

    table = TRADE_CDC.staging
    bad = rows(("T_batch2_0001.txt", 1, 5), ("T_batch2_0001.txt", 2, 4))
    checked = check_staged(
        table, bad, BY_CDC_DSN, None, {"T_batch2_0001.txt": "t_batch2_0000"}, missing_policy="warn", resumed=False
    )
    assert [(o.check.id, o.action, o.unexpected_count) for o in checked.outcomes] == [
        ("declared_order", "halted", 1),
        ("predecessor_present", "warned", 1),
    ]
    assert checked.outcomes[1].failing_values == ("T_batch2_0001.txt (missing t_batch2_0000)",)
    resumed = check_staged(table, bad, BY_CDC_DSN, None, {}, missing_policy="halt", resumed=True)
    assert [(o.check.id, o.action) for o in resumed.outcomes] == [
        ("declared_order", "overridden"),
        ("predecessor_present", "passed"),
    ]
    halting = check_staged(
        table,
        rows(("T_batch2_0003.txt", 1, 1)),
        BY_CDC_DSN,
        None,
        {"T_batch2_0003.txt": "t_batch2_0002"},
        missing_policy="halt",
        resumed=False,
    )
    assert [o.action for o in halting.halts] == ["halted"]
    assert (
        check_staged(table, rows(("Batch2/P.csv", 1, 1)), BAG, None, {}, missing_policy="warn", resumed=False).outcomes
        == []
    )
    result = checked.result_rows(7, 0).to_pylist()
    assert [(r["batch_id"], r["table_name"], r["check_id"], r["policy"]) for r in result] == [
        (7, "staging.trade_cdc", "declared_order", "halt"),
        (7, "staging.trade_cdc", "predecessor_present", "warn"),
    ]
