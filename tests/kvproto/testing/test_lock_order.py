"""The kit finds a lock-order inversion among a tier's own locks from the orders alone (TIER-11; the kit's
``LockOrder``): found whichever thread runs which path and whether or not the two ever interleaved, and never
for orders a common gate lock guards, for two locks of one class, or for the standard library's locks."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

from kvproto.testing import Inversion, LockOrder


class _TwoLocks:
    """Two locks of two classes (made on two lines) and a gate."""

    def __init__(self) -> None:
        self.cache = threading.Lock()
        self.store = threading.Lock()
        self.gate = threading.Lock()

    def write_through(self) -> None:
        with self.cache, self.store:
            pass

    def promote(self) -> None:
        with self.store, self.cache:
            pass

    def gated_write(self) -> None:
        with self.gate, self.cache, self.store:
            pass

    def gated_promote(self) -> None:
        with self.gate, self.store, self.cache:
            pass


def _found(order: LockOrder) -> Inversion | None:
    """The inversion ``order`` found so far (read through a call: it changes as locks are taken)."""
    return order.inversion


def _on_a_thread(work: object) -> None:
    assert callable(work)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def test_opposite_orders_on_two_threads_are_an_inversion_that_names_both_paths() -> None:
    with LockOrder() as order:
        locks = _TwoLocks()
        _on_a_thread(locks.write_through)
        assert _found(order) is None  # one order alone is no cycle
        locks.promote()  # never at the same time as the write: no deadlock happened
    assert order.inversion is not None
    said = order.inversion.describe()
    assert "lock-order inversion" in said
    assert "(write_through)" in said and "(promote)" in said  # each order's place
    assert said.count("test_lock_order.py:") == 6  # two locks' classes and a place, for each of the two orders


def test_orders_taken_under_one_gate_are_no_inversion() -> None:
    with LockOrder() as order:
        locks = _TwoLocks()
        _on_a_thread(locks.gated_write)
        locks.gated_promote()
    assert order.inversion is None


def test_one_ungated_order_makes_the_gate_no_excuse() -> None:
    with LockOrder() as order:
        locks = _TwoLocks()
        locks.gated_write()
        locks.gated_promote()
        assert _found(order) is None
        locks.write_through()  # cache -> store once without the gate: it can hold cache while promote waits
    assert order.inversion is not None


def test_locks_of_one_class_nested_are_left_alone() -> None:
    with LockOrder() as order:
        shards = [threading.Lock() for _ in range(2)]  # one line: one class
        with shards[0], shards[1]:
            pass
        with shards[1], shards[0]:
            pass
    assert order.inversion is None


def test_standard_library_locks_are_not_traced_and_the_factory_is_put_back() -> None:
    plain = threading.Lock
    with LockOrder() as order:
        traced = threading.Lock()
        event = threading.Event()
        jobs: queue.Queue[int] = queue.Queue()
        with traced:
            event.set()
            jobs.put(1)
        event.wait()
        assert jobs.get() == 1
        assert "traced lock" in repr(traced)
        assert "traced lock" not in repr(jobs.mutex)
    assert threading.Lock is plain
    assert order.inversion is None


def test_a_lock_released_by_another_thread_leaves_no_order_behind() -> None:
    with LockOrder() as order:
        locks = _TwoLocks()
        locks.cache.acquire()
        _on_a_thread(locks.cache.release)  # a Lock may be released by any thread (a hand-off)
        with locks.store, locks.cache:  # cache no longer held here: store -> cache is the only order
            pass
        with locks.store:
            pass
    assert order.inversion is None


def test_entries_left_out_of_order_put_the_standard_factory_back() -> None:
    plain = threading.Lock
    first, second = LockOrder(), LockOrder()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # left before the one entered after it (another thread's check)
    assert "traced lock" in repr(threading.Lock())  # still traced: the second is entered
    second.__exit__(None, None, None)
    assert threading.Lock is plain


def test_a_forked_child_takes_traced_locks_though_a_parent_thread_was_recording() -> None:
    """The kit's crash check forks writers while the tier's threads run: a recording in progress at the fork
    (the monitor's own mutex held) must not hang the child's first lock."""
    with LockOrder() as order:
        locks = _TwoLocks()
        order._mutex.acquire()  # as another thread of the parent, recording an order at the moment of the fork
        pid = os.fork()
        if pid == 0:  # the child: take two traced locks and say it got through
            code = 1
            try:
                with locks.cache, locks.store:
                    code = 0
            finally:
                os._exit(code)
        order._mutex.release()
        deadline = time.monotonic() + 10.0
        done, status = 0, 0
        while done == 0 and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            time.sleep(0.01)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert done == pid, "the child hung on its first traced lock"
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_gated_cycle_does_not_hide_an_ungated_one_through_the_same_locks() -> None:
    with LockOrder() as order:
        gate = threading.Lock()
        first = threading.Lock()
        second = threading.Lock()
        third = threading.Lock()
        with gate, second, first:  # second -> first, under the gate
            pass
        with second, third:  # second -> third, no gate
            pass
        with third, first:  # third -> first, no gate
            pass
        assert _found(order) is None  # no order leaves first yet
        with gate, first, second:  # first -> second under the gate: closes a gated 2-cycle and an ungated 3-cycle
            pass
    assert order.inversion is not None
    assert len(order.inversion.orders) == 3  # first -> second -> third -> first
