"""The transform's step graph: waves in dependency order, and the steps of one wave running at the same time."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest

from jobs import transform, validate
from jobs.transform import STEPS, Step, waves
from schemas.model import Column, Table
from streamdi.lake import Lake


def ctx_of(lake: Lake, *, steps_beside: bool = True) -> SimpleNamespace:
    return SimpleNamespace(lake=lake, settings=SimpleNamespace(steps_beside=steps_beside))


def run_checked(monkeypatch, lake: Lake, step, checks, **kwargs) -> transform.TransformReport:
    """Micro-batch 7 through the declared graph with `step(name)` as every step's work and `checks` as the suites."""
    fake = tuple(Step(s.name, step(s.name), s.after, checked=s.checked, reads_checks=s.reads_checks) for s in STEPS)
    monkeypatch.setattr(transform, "STEPS", fake)
    monkeypatch.setattr(transform, "load_scope", lambda _ctx, _batch: None)
    monkeypatch.setattr(validate, "validate_step", checks)
    return transform.run(ctx_of(lake), 7, **kwargs)


def test_the_declared_steps_run_in_five_waves_with_t1_and_t2_and_then_t3_and_t4_together():
    assert [[s.name for s in wave] for wave in waves(STEPS)] == [["T0"], ["T1", "T2"], ["T3", "T4"], ["AG"], ["DM"]]


def test_an_unsatisfiable_dependency_is_refused():
    with pytest.raises(ValueError, match="unsatisfiable"):
        waves((Step("A", lambda c, s: {}, after=("B",)), Step("B", lambda c, s: {}, after=("A",))))


def test_steps_of_one_wave_run_at_the_same_time_and_waves_in_order(monkeypatch, tmp_path):
    """T1 and T2 each wait at a barrier for the other, and so do T3 and T4: the run only ends if they overlap."""
    barriers = {"T1": threading.Barrier(2, timeout=10), "T3": threading.Barrier(2, timeout=10)}
    barriers["T2"], barriers["T4"] = barriers["T1"], barriers["T3"]
    order: list[str] = []

    def step(name: str):
        def run(_ctx, _scope):
            if name in barriers:
                barriers[name].wait()
            order.append(name)
            return {name: 1}

        return run

    fake = tuple(Step(s.name, step(s.name), s.after) for s in STEPS)
    monkeypatch.setattr(transform, "STEPS", fake)
    monkeypatch.setattr(transform, "load_scope", lambda _ctx, _batch: None)
    report = transform.run(ctx_of(Lake(tmp_path)), 7)
    assert order[0] == "T0" and sorted(order[1:3]) == ["T1", "T2"]
    assert sorted(order[3:5]) == ["T3", "T4"] and order[5:] == ["AG", "DM"]
    assert report.rows == {"T0": 1, "T1": 1, "T2": 1, "T3": 1, "T4": 1, "AG": 1, "DM": 1}
    assert list(report.seconds) == ["T0", "T1", "T2", "T3", "T4", "AG", "DM"]


def test_with_steps_beside_off_the_steps_run_one_at_a_time_in_declared_order(monkeypatch, tmp_path):
    """`STREAMDI_STEPS_BESIDE=false` (a first load under a memory cap): no two steps overlap."""
    running, overlaps, order = [0], [], []

    def step(name: str):
        def run(_ctx, _scope):
            running[0] += 1
            overlaps.append(running[0])
            time.sleep(0.02)
            order.append(name)
            running[0] -= 1
            return {name: 1}

        return run

    monkeypatch.setattr(transform, "STEPS", tuple(Step(s.name, step(s.name), s.after) for s in STEPS))
    monkeypatch.setattr(transform, "load_scope", lambda _ctx, _batch: None)
    report = transform.run(ctx_of(Lake(tmp_path), steps_beside=False), 7)
    assert order == ["T0", "T1", "T2", "T3", "T4", "AG", "DM"] and overlaps == [1] * 7
    assert report.rows == {name: 1 for name in order}


def test_a_failing_step_fails_the_run_after_its_wave(monkeypatch, tmp_path):
    ran: list[str] = []

    def ok(name):
        return lambda _c, _s: ran.append(name) or {}

    def boom(_c, _s):
        raise RuntimeError("T1 broke")

    fake = tuple(Step(s.name, boom if s.name == "T1" else ok(s.name), s.after) for s in STEPS)
    monkeypatch.setattr(transform, "STEPS", fake)
    monkeypatch.setattr(transform, "load_scope", lambda _ctx, _batch: None)
    with pytest.raises(RuntimeError, match="T1 broke"):
        transform.run(ctx_of(Lake(tmp_path)), 7)
    assert ran == ["T0", "T2"]  # T2 (same wave) finished; T3, T4, AG and DM never started


def test_t0_to_t4_and_ag_are_followed_by_their_warehouse_suites_and_dm_is_not():
    from jobs.validate import STEP_TABLES

    assert [s.name for s in STEPS if s.checked] == ["T0", "T1", "T2", "T3", "T4", "AG"]
    assert sorted(STEP_TABLES) == ["AG", "T0", "T1", "T2", "T3", "T4"]


def test_each_migrated_table_is_declared_final_by_at_most_one_step_and_dimessages_by_none():
    """`Step.final` tells a migration beside the transform when a table is complete: a table two steps declared
    would be taken after the first of them."""
    from schemas.warehouse import DI_MESSAGES, WAREHOUSE_TABLES

    declared = [t.qualified_name for s in STEPS for t in s.final]
    assert len(declared) == len(set(declared))
    assert set(declared) == {t.qualified_name for t in WAREHOUSE_TABLES} - {DI_MESSAGES.qualified_name}


def test_a_steps_checks_run_beside_the_next_wave_whose_commits_wait_for_them_and_stop_at_a_halt(monkeypatch, tmp_path):
    """T2's checks take a while and fail a halt check: T3 and T4 start meanwhile (they read and compute), but their
    commits wait for the checks and are refused, so nothing of theirs is written; AG and DM never start."""
    lake = Lake(tmp_path)
    target = Table(name="t3_output", layer="warehouse", columns=(Column("id", "int", False),), key=("id",))
    started: list[str] = []
    checking = threading.Event()

    def step(name: str):
        def run(ctx, _scope):
            started.append(name)
            if name == "T3":
                assert checking.wait(10)  # T2's checks are running: T3 overlaps them
                ctx.lake.append(target, pa.table({"id": pa.array([1], pa.int32())}), app_id="T3/x", version=7)
            return {name: 1}

        return run

    def checks(_ctx, _batch, step, attempt=0):
        found = validate.StepChecks(step)
        if step == "T2":
            checking.set()
            time.sleep(0.3)
            found.halts.append("warehouse.dimcustomer: check one_current_version_per_customer failed")
        return found

    report = run_checked(monkeypatch, lake, step, checks)
    assert report.halts == ["warehouse.dimcustomer: check one_current_version_per_customer failed"]
    assert sorted(started) == ["T0", "T1", "T2", "T3", "T4"]
    assert not lake.exists(target)  # T3's commit (the table's creation included) was refused
    assert sorted(report.rows) == ["T0", "T1", "T2"]


def test_a_step_is_reported_committed_as_soon_as_it_returns_before_its_checks_and_its_wave(monkeypatch, tmp_path):
    """A migration beside the transform lands a step's tables once the step has committed them: T3 is reported while
    T4 (same wave) still runs and before T3's own checks are done; a halt found by those checks afterwards still
    stops the run (the migration then rolls back what it landed)."""
    reported: list[str] = []
    t4_may_end = threading.Event()
    t3_checks_may_end = threading.Event()

    def step(name: str):
        def run(_ctx, _scope):
            if name == "T4":
                assert t4_may_end.wait(10)
            return {name: 1}

        return run

    def checks(_ctx, _batch, step, attempt=0):
        found = validate.StepChecks(step)
        if step == "T3":
            assert t3_checks_may_end.wait(10)
            found.halts.append("warehouse.dimtrade: check one_row_per_trade failed")
        return found

    def on_committed(name: str) -> None:
        # T4 can only end once T3 is reported, and T3's checks only once T4 is: the run ends only if both are
        # reported while T4 still ran and T3's checks were still running (a failed wait fails the step or check)
        reported.append(name)
        {"T3": t4_may_end, "T4": t3_checks_may_end}.get(name, threading.Event()).set()

    report = run_checked(monkeypatch, Lake(tmp_path), step, checks, on_committed=on_committed)
    assert report.halts == ["warehouse.dimtrade: check one_row_per_trade failed"]
    assert reported[0] == "T0" and sorted(reported[1:3]) == ["T1", "T2"]
    # AG (which commits nothing here; a commit would wait for T3's checks and be refused) ran; DM never started
    assert reported[3:] == ["T3", "T4", "AG"]


def test_a_steps_checks_begin_as_it_returns_beside_its_wave_and_never_hold_that_waves_commits(monkeypatch, tmp_path):
    """T3 returns while T4 still runs: T3's checks begin at once (T4 waits to see them running), and T4's commit
    made while they run goes through, though they end with a failed halt check; the next wave's commit is refused
    and DM never starts."""
    lake = Lake(tmp_path)
    target = Table(name="t4_output", layer="warehouse", columns=(Column("id", "int", False),), key=("id",))
    later = Table(name="ag_output", layer="warehouse", columns=(Column("id", "int", False),), key=("id",))
    t3_checking, t4_committed = threading.Event(), threading.Event()
    started: list[str] = []

    def step(name: str):
        def run(ctx, _scope):
            started.append(name)
            if name == "T4":
                assert t3_checking.wait(10)  # T3's checks run while T4 has not returned
                ctx.lake.append(target, pa.table({"id": pa.array([4], pa.int32())}), app_id="T4/x", version=7)
                t4_committed.set()
            if name == "AG":
                ctx.lake.append(later, pa.table({"id": pa.array([5], pa.int32())}), app_id="AG/x", version=7)
            return {name: 1}

        return run

    def checks(_ctx, _batch, step, attempt=0):
        found = validate.StepChecks(step)
        if step == "T3":
            t3_checking.set()
            assert t4_committed.wait(10)  # T4's commit was not held by these checks
            found.halts.append("warehouse.dimtrade: check one_row_per_trade failed")
        return found

    report = run_checked(monkeypatch, lake, step, checks)
    assert report.halts == ["warehouse.dimtrade: check one_row_per_trade failed"]
    assert lake.read_arrow(target)["id"].to_pylist() == [4]
    assert not lake.exists(later)  # AG's commit waited for T3's checks and was refused
    assert "DM" not in started


@pytest.mark.parametrize("source_batches", [(1,), (2,)], ids=["historical-parts-in-turn", "incremental-parts-beside"])
def test_t3_and_t4_announce_each_table_as_its_part_returns_not_when_the_step_ends(monkeypatch, source_batches):
    """A migration beside the transform lands a table once a step says it is finished (`BatchScope.finished`): T3
    and T4 say so for each table as the part that writes it returns, so FactMarketHistory is announced before
    FactWatches' part has ended, and FactHoldings / FactCashBalances before the other part of T3 has."""
    heard: list[str] = []
    announced = {name: threading.Event() for name in ("factmarkethistory", "factholdings")}

    def part(table: str, after: str | None = None):
        def run(_ctx, _scope):
            # a part that may only end once `after` has been announced
            assert after is None or announced[after].wait(10), f"{after} was not announced before {table}'s part ended"
            return {table: 1}

        return run

    def on_finished(tables) -> None:
        for t in tables:
            heard.append(t.name)
            if t.name in announced:
                announced[t.name].set()

    # in turn (Batch1) each step's first part runs before its second, which may only end once the first part's table
    # was announced; beside each other (incremental), the second part runs in the pool and waits for the same
    monkeypatch.setattr(transform.market_history, "run", part("factmarkethistory"))
    monkeypatch.setattr(transform.watches, "run", part("factwatches", after="factmarkethistory"))
    monkeypatch.setattr(transform.create_trades, "run", part("dimtrade"))
    monkeypatch.setattr(transform.holdings, "run", part("factholdings"))
    monkeypatch.setattr(transform.cash_balances, "run", part("factcashbalances", after="factholdings"))
    ctx = ctx_of(None)
    scope = transform.BatchScope(batch_id=7, source_batches=source_batches, on_finished=on_finished)

    assert transform.market_and_watches(ctx, scope) == {"factmarkethistory": 1, "factwatches": 1}
    assert transform.trades_and_holdings(ctx, scope) == {"dimtrade": 1, "factholdings": 1, "factcashbalances": 1}
    assert heard == ["factmarkethistory", "factwatches", "dimtrade", "factholdings", "factcashbalances"]
