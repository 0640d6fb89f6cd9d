"""The lender of costly handles (`streamdi.lending`): one handle per borrower at a time, kept for the next."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from streamdi.lending import Lender


class Handle:
    def __init__(self, key: str, number: int) -> None:
        self.key, self.number, self.caught_up = key, number, 0


def lender(fail_catch_up: bool = False) -> tuple[Lender[Handle], list[Handle]]:
    opened: list[Handle] = []

    def opener(key):
        opened.append(Handle(key, len(opened)))
        return opened[-1]

    def catch_up(key, handle):
        assert key == handle.key
        if fail_catch_up:
            raise OSError("log unreadable")
        handle.caught_up += 1

    return Lender(opener, catch_up), opened


def test_borrowers_one_after_another_on_different_threads_share_one_handle_caught_up_each_time():
    handles, opened = lender()
    seen = []

    def borrow(_):
        with handles.lend("t", stamp=1) as handle:
            seen.append(handle)

    with ThreadPoolExecutor(1) as first, ThreadPoolExecutor(1) as second:
        for i in range(6):
            (first if i % 2 else second).submit(borrow, i).result()
    assert len(opened) == 1 and all(h is opened[0] for h in seen)
    assert opened[0].caught_up == 5  # every lend but the first, which opened it
    assert handles.held() == 1


def test_borrowers_at_the_same_moment_never_share_a_handle():
    handles, opened = lender()
    inside = threading.Barrier(3)
    seen = []

    def borrow(_):
        with handles.lend("t", stamp=1) as handle:
            seen.append(handle)
            inside.wait(timeout=10)  # all three hold a handle at once

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(borrow, range(3)))
    assert len(opened) == 3 and len({id(h) for h in seen}) == 3
    assert handles.held() == 3
    with handles.lend("t", stamp=1) as handle:
        assert handle in opened and handles.held() == 2


def test_keys_are_apart():
    handles, opened = lender()
    with handles.lend("a", stamp=1) as a:
        pass
    with handles.lend("b", stamp=1) as b:
        pass
    assert a is not b and (a.key, b.key) == ("a", "b") and len(opened) == 2


def test_a_borrower_that_fails_gives_nothing_back():
    handles, opened = lender()
    with pytest.raises(RuntimeError), handles.lend("t", stamp=1):
        raise RuntimeError("write failed")
    assert handles.held() == 0
    with handles.lend("t", stamp=1) as handle:
        assert handle is opened[1]


def test_a_handle_of_another_stamp_is_let_go_and_no_stamp_is_never_kept():
    handles, opened = lender()
    with handles.lend("t", stamp=1):
        pass
    with handles.lend("t", stamp=2) as handle:  # the table was created again
        assert handle is opened[1] and opened[0].caught_up == 0
    assert handles.held() == 1
    with handles.lend("t", stamp=None) as handle:
        assert handle is opened[2]
    assert handles.held() == 1


def test_a_handle_that_cannot_catch_up_is_replaced():
    handles, opened = lender(fail_catch_up=True)
    with handles.lend("t", stamp=1):
        pass
    with handles.lend("t", stamp=1) as handle:
        assert handle is opened[1]
    assert len(opened) == 2 and handles.held() == 1
