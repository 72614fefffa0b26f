"""What ``KvprotoHiCacheStorage`` promises SGLang's controller beyond a round trip: RETRY as a bounded
wait, a stalled read that never writes late, keys scoped by rank, layout and dtype, a close that
releases everything, and a configuration error that names its field (SGL-2, SGL-3, SGL-5, SGL-6)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.utils import get_storage_hash_str

from kvproto.errors import ConfigurationError

from kvproto_sglang import KvprotoHiCacheStorage
from tests.adapters.sglang.sglang_controller import HostPool, closed_after, storage_config
from tests.adapters.sglang.sglang_tiers import GatedLoads, Retrying

BASE = {"backend_name": "kvproto", "module_path": "kvproto_sglang", "class_name": "KvprotoHiCacheStorage", "interface_v1": 1}


@pytest.fixture
def backends() -> Iterator[list[KvprotoHiCacheStorage]]:
    yield from closed_after([])


def backend(made: list[KvprotoHiCacheStorage], pool: HostPool, tier: str, options: dict[str, Any] | None = None,
            **kw: Any) -> KvprotoHiCacheStorage:
    more: dict[str, Any] = {k: kw.pop(k) for k in ("retry_wait_s", "load_timeout_s", "slots") if k in kw}
    built = KvprotoHiCacheStorage(storage_config({**BASE, "tier": tier, "options": options or {}, **more}, **kw), {})
    built.register_mem_pool_host(pool)
    made.append(built)
    return built


def pages_of(pool: HostPool, n: int) -> tuple[list[str], torch.Tensor]:
    """``n`` page keys and the host indices of pool pages 0..n-1."""
    keys = list(get_storage_hash_str(list(range(n * pool.page_size)), None, page_size=pool.page_size))
    return keys, torch.arange(0, n * pool.page_size, dtype=torch.int64)


def test_a_key_answering_retry_is_asked_again_and_counted_once_it_hits(backends: list[KvprotoHiCacheStorage]) -> None:
    """SGL-2: RETRY is not a miss: the key is asked again after the tier's next steps, and counts when it hits."""
    pool = HostPool(pages=8)
    pool.fill_random(seed=1)
    built = backend(backends, pool, "tests.adapters.sglang.sglang_tiers:retrying", {"retries": 3}, retry_wait_s=0.9)
    keys, host = pages_of(pool, 4)
    assert built.batch_set_v1(keys, host) == [True] * 4
    assert built.batch_exists(keys) == 4
    tier = built.hosted_tier
    assert isinstance(tier, Retrying) and min(tier.asked.values()) == 4


def test_a_key_that_keeps_answering_retry_counts_as_absent_within_the_bound(backends: list[KvprotoHiCacheStorage]) -> None:
    """SGL-2: a tier that never settles costs SGLang's existence thread at most ``retry_wait_s``: the
    call returns with the prefix before that key."""
    pool = HostPool(pages=8)
    built = backend(backends, pool, "tests.adapters.sglang.sglang_tiers:retrying", {"retries": -1}, retry_wait_s=0.05)
    keys, _ = pages_of(pool, 3)
    assert built.batch_exists(keys) == 0
    tier = built.hosted_tier
    assert isinstance(tier, Retrying) and tier.asked[next(iter(tier.asked))] > 1


def test_a_stalled_read_is_not_loaded_and_nothing_is_written_after_it_returned(backends: list[KvprotoHiCacheStorage]) -> None:
    """SGL-5: a read the tier does not finish within ``load_timeout_s`` answers not loaded; when the tier
    reports it later, the host pool (which SGLang may have reused) is not written."""
    pool = HostPool(pages=8)
    pool.fill_random(seed=2)
    built = backend(backends, pool, "tests.adapters.sglang.sglang_tiers:gated_loads", load_timeout_s=0.05, slots=4)
    keys, host = pages_of(pool, 4)
    assert built.batch_set_v1(keys, host) == [True] * 4
    dest = torch.arange(4 * pool.page_size, 8 * pool.page_size, dtype=torch.int64)
    before = [pool.page_bytes(p) for p in range(4, 8)]
    assert built.batch_get_v1(keys, dest) == [False] * 4
    tier = built.hosted_tier
    assert isinstance(tier, GatedLoads)
    tier.gate.set()
    deadline = time.monotonic() + 30
    while tier.reported_loads == 0 and time.monotonic() < deadline:  # the tier thread steps every millisecond
        time.sleep(0.001)
    assert tier.reported_loads == 1
    assert [pool.page_bytes(p) for p in range(4, 8)] == before
    # Its staging rows came back: the next read of the same pages loads them.
    assert built.batch_get_v1(keys, dest) == [True] * 4
    assert [pool.page_bytes(p) for p in range(4, 8)] == [pool.page_bytes(p) for p in range(4)]


@pytest.mark.parametrize(("writer", "reader", "shared"), [
    ({"tp_rank": 0, "tp_size": 2}, {"tp_rank": 1, "tp_size": 2}, False),
    ({"tp_rank": 0, "tp_size": 2, "mla": True}, {"tp_rank": 1, "tp_size": 2, "mla": True}, True),
    ({"model_name": "a/one"}, {"model_name": "a/two"}, False),
], ids=["tp-ranks-apart", "mla-ranks-share", "models-apart"])
def test_keys_are_scoped_by_rank_as_sglangs_backends_scope_them(
        writer: dict[str, Any], reader: dict[str, Any], shared: bool, tmp_path: Path,
        backends: list[KvprotoHiCacheStorage]) -> None:
    """SGL-3: two ranks over one fs root see each other's pages only where SGLang shares them (MLA)."""
    pool = HostPool(pages=4)
    pool.fill_random(seed=3)
    options = {"root": str(tmp_path)}
    first, second = backend(backends, pool, "fs", options, **writer), backend(backends, pool, "fs", options, **reader)
    keys, host = pages_of(pool, 2)
    assert first.batch_set_v1(keys, host) == [True, True]
    assert second.batch_exists(keys) == (2 if shared else 0)


def test_an_mla_replica_stores_nothing_and_a_pool_of_another_format_finds_nothing(
        tmp_path: Path, backends: list[KvprotoHiCacheStorage]) -> None:
    """SGL-3: only the MLA storage writer writes; a pool of another dtype or layout never reads the pages."""
    pool = HostPool(pages=4)
    pool.fill_random(seed=4)
    options = {"root": str(tmp_path)}
    replica = backend(backends, pool, "fs", options, tp_rank=1, tp_size=2, mla=True)
    keys, host = pages_of(pool, 2)
    assert replica.batch_set_v1(keys, host) == [True, True]  # as SGLang's own backends answer a replica
    assert replica.batch_exists(keys) == 0
    writer = backend(backends, pool, "fs", options)
    assert writer.batch_set_v1(keys, host) == [True, True] and writer.batch_exists(keys) == 2
    for other in (HostPool(pages=4, dtype=torch.float16), HostPool(pages=4, layout="page_first")):
        assert backend(backends, other, "fs", options).batch_exists(keys) == 0


def test_close_stops_the_tier_thread_shuts_the_tier_down_and_later_calls_fail(backends: list[KvprotoHiCacheStorage]) -> None:
    """SGL-6: ``close`` joins the backend's thread and shuts the tier down; later calls answer
    nothing found, nothing loaded, nothing stored; a second close does nothing."""
    pool = HostPool(pages=4)
    pool.fill_random(seed=5)
    built = backend(backends, pool, "memory")
    keys, host = pages_of(pool, 2)
    assert built.batch_set_v1(keys, host) == [True, True]
    running = _tier_threads()
    assert running >= 1
    built.close()
    assert built.hosted_tier is None
    assert _tier_threads() == running - 1
    assert built.batch_exists(keys) == 0
    assert built.batch_get_v1(keys, host) == [False, False]
    assert built.batch_set_v1(keys, host) == [False, False]
    assert built.batch_get(keys) == [None, None]
    built.close()


def _tier_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "kvproto-sglang-tier")


@pytest.mark.parametrize(("extra", "named"), [
    ({}, "tier"),
    ({"tier": "memory", "slots": 0}, "slots"),
    ({"tier": "memory", "retry_wait_s": 1.0}, "retry_wait_s"),
    ({"tier": "memory", "load_timeout_s": 2.0, "prefetch_timeout_s": 1.5}, "load_timeout_s"),
    ({"tier": "memory", "root": "/x"}, "root"),
], ids=["no-tier", "slots", "retry-past-prefetch-timeout", "load-past-prefetch-timeout", "unknown-field"])
def test_a_bad_extra_config_is_a_configuration_error_naming_the_field(extra: dict[str, Any], named: str) -> None:
    """SGL-1: SGLang's factory re-raises it at attach time, with the field in the message."""
    with pytest.raises(ConfigurationError, match=named):
        KvprotoHiCacheStorage(storage_config({**BASE, **extra}), {})


def test_a_page_of_another_size_or_no_page_fails_only_its_own_key(backends: list[KvprotoHiCacheStorage]) -> None:
    """SGL-5: bad input fails its key (never stored, never loaded into a target of another size); the others go through."""
    pool = HostPool(pages=4)
    built = backend(backends, pool, "memory")
    page = pool.get_dummy_flat_data_page().view(torch.uint8).fill_(7).view(pool.dtype)
    keys, _ = pages_of(pool, 3)
    assert built.batch_set(keys, [page, page[:-1], None]) is False
    assert [built.batch_exists([k]) for k in keys] == [1, 0, 0]
    wrong_size = torch.zeros(page.numel() + 1, dtype=pool.dtype)
    assert built.batch_get(keys[:1], [wrong_size]) == [None] and not wrong_size.any()
    (loaded,) = built.batch_get(keys[:1], [torch.zeros_like(page)])
    assert loaded is not None and torch.equal(loaded.view(torch.uint8), page.view(torch.uint8))


def test_a_tier_that_cannot_be_built_fails_every_call_and_says_why(
        tmp_path: Path, backends: list[KvprotoHiCacheStorage], caplog: pytest.LogCaptureFixture) -> None:
    """SGL-1: a bad tier option surfaces on the backend's thread: every call answers nothing stored,
    found or loaded (nothing waits forever), and the log names the tier and the reason."""
    pool = HostPool(pages=4)
    with caplog.at_level("ERROR", logger="kvproto_sglang"):
        built = backend(backends, pool, "fs", {"root": str(tmp_path / "missing")})
        keys, host = pages_of(pool, 2)
        assert built.batch_set_v1(keys, host) == [False, False]
        assert built.batch_exists(keys) == 0
        assert built.batch_get_v1(keys, host) == [False, False]
    assert built.hosted_tier is None
    assert any("building kvproto tier 'fs' failed" in r.getMessage() for r in caplog.records)
    assert "does not exist" in caplog.text
