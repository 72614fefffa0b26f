"""kvproto.hosting's hosting worker, as the engine adapters drive it (kvproto-lmcache's L2 adapter,
kvproto-sglang's backend): a real ``memory`` tier built by name over staging rows, its jobs'
outcomes by the work they were for, its failures answered, never raised, and the one thread that
calls it (KIT-9, TIER-3, TIER-16)."""

from __future__ import annotations

import logging
import threading

import pytest

from kvproto import OffloadKey, ReqContext
from kvproto.errors import ConfigurationError
from kvproto.hosting import HostedTier, HostingThread, StagingRows, split_class_path

LOG = logging.getLogger("kvproto.tests.hosting")
KEY = OffloadKey(b"k" * 16)


def test_a_hosted_tier_stores_and_loads_through_staging_rows_and_reports_each_job_by_its_work() -> None:
    host: HostedTier[str] = HostedTier("memory", {}, who="test", log=LOG)
    rows = StagingRows(4, 8)
    assert host.open(rows) is not None and host.open_error is None
    rows.row(0)[:] = b"abcdefgh"
    context = ReqContext("r1")
    assert host.submit("store it", [KEY], [0], load=False, context=context)
    assert host.step() == [("store it", [True])]
    assert host.lookup(KEY, context) is True
    assert host.lookup(OffloadKey(b"x" * 16), context) is False
    assert host.submit("load it", [KEY], [3], load=True, context=context) and host.in_flight()
    assert host.step() == [("load it", [True])]
    assert bytes(rows.row(3)) == b"abcdefgh"
    host.end_request(context)
    assert host.shut_down() == [] and host.tier is None
    assert not host.submit("too late", [KEY], [1], load=False, context=context)
    assert host.lookup(KEY, context) is False


def test_a_tier_that_cannot_be_built_is_tried_once_and_every_work_fails(caplog: pytest.LogCaptureFixture) -> None:
    host: HostedTier[str] = HostedTier("no-such-tier-anywhere", {}, who="test", log=LOG)
    rows = StagingRows(2, 8)
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        assert host.open(rows) is None
        assert host.open(rows) is None
    assert host.open_error is not None and "no-such-tier-anywhere" in host.open_error
    assert len([r for r in caplog.records if "building kvproto tier" in r.getMessage()]) == 1
    assert not host.submit("w", [KEY], [0], load=False, context=ReqContext("r"))
    assert host.step() == []
    with pytest.raises(ConfigurationError):
        host.build(rows)  # the raising build, for an adapter whose configuration is at fault


def test_the_hosting_thread_admits_what_is_handed_over_and_stop_returns_what_it_never_took() -> None:
    admitted: list[list[int]] = []
    seen = threading.Event()

    def admit(items: list[int]) -> None:
        admitted.append(items)
        seen.set()

    thread: HostingThread[int] = HostingThread("kvproto-test-hosting", admit=admit, step=lambda: None,
                                               busy=lambda: False, who="test", log=LOG)
    assert thread.hand_over(1)
    assert seen.wait(10)
    assert admitted == [[1]]
    with thread.lock:  # held: the thread cannot take it before it is withdrawn
        assert thread.hand_over(2) and thread.withdraw(2) and not thread.withdraw(2)
    assert thread.stop() == []
    assert not thread.hand_over(3)
    assert thread.stop() is None


@pytest.mark.parametrize("path", ["pkg.mod", "pkg.mod:", ":Cls"])
def test_an_engine_target_without_module_and_class_is_an_error_naming_it(path: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^sglang:.*: expected sglang:MODULE:CLASS$"):
        split_class_path(f"sglang:{path}", path)
    assert split_class_path("vllm:pkg.mod:Cls", "pkg.mod:Cls") == ("pkg.mod", "Cls")
