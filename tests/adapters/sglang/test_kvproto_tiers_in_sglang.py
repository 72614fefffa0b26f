"""kvproto's memory and fs tiers inside SGLang 0.5.23, driven by SGLang's own storage-thread code
(``sglang_controller.py``): built by SGLang's ``StorageBackendFactory`` from the dynamic backend's
extra config, both data paths, both host-pool layouts, three threads at once, and a tier that fails
half its jobs (SGL-1, SGL-4, SGL-5, SGL-7)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE, HiCacheStorage
from sglang.srt.mem_cache.utils import get_storage_hash_str

from kvproto_sglang import KvprotoHiCacheStorage
from tests.adapters.sglang.sglang_controller import HostPool, StorageController, closed_after, storage_config
from tests.adapters.sglang.sglang_tiers import HalfFailing

TIERS = ["memory", "fs"]


def extra(tier: str, tmp_path: Path, *, v1: bool, **more: Any) -> dict[str, Any]:
    """The dynamic backend's extra config hosting ``tier`` (``fs`` rooted in ``tmp_path``)."""
    options: dict[str, Any] = {}
    if tier == "fs":
        (tmp_path / "fs").mkdir(exist_ok=True)
        options["root"] = str(tmp_path / "fs")
    return {"backend_name": "kvproto", "module_path": "kvproto_sglang", "class_name": "KvprotoHiCacheStorage",
            "interface_v1": int(v1), "tier": tier, "options": options, **more}


@pytest.fixture
def controllers() -> Iterator[list[StorageController]]:
    yield from closed_after([])


def controller(made: list[StorageController], config: dict[str, Any], pool: HostPool, **kw: Any) -> StorageController:
    built = StorageController("dynamic", storage_config(config, **kw), pool)
    made.append(built)
    return built


def sequence(n: int, pages: int, page_size: int) -> list[int]:
    """Token ids of sequence ``n``: ``pages`` pages, no prefix shared with another sequence."""
    return [n * 1_000_003 + t for t in range(pages * page_size)]


def test_sglangs_factory_builds_the_backend_from_the_dynamic_extra_config(
        tmp_path: Path, controllers: list[StorageController]) -> None:
    """SGL-1: ``--hicache-storage-backend dynamic`` with module_path/class_name builds the backend."""
    built = controller(controllers, extra("memory", tmp_path, v1=True), HostPool(pages=8))
    assert isinstance(built.storage_backend, KvprotoHiCacheStorage)
    assert isinstance(built.storage_backend, HiCacheStorage)
    assert built.page_get_func == built._page_get_zero_copy


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("v1", [True, False], ids=["batch_v1", "batch_generic"])
@pytest.mark.parametrize("tier", TIERS)
def test_sglangs_controller_round_trip_is_byte_exact(
        tier: str, v1: bool, layout: str, tmp_path: Path, controllers: list[StorageController]) -> None:
    """SGL-1: pages backed up by SGLang's ``_page_backup`` are found by ``_storage_hit_query`` and
    transferred by ``_page_transfer`` byte for byte, past one ``STORAGE_BATCH_SIZE`` batch and more
    pages than the staging rows; a never-stored sequence hits nothing."""
    pages = STORAGE_BATCH_SIZE + 37
    pool = HostPool(pages=2 * pages + 8, layout=layout)
    pool.fill_random(seed=7)
    built = controller(controllers, extra(tier, tmp_path, v1=v1, slots=48), pool, page_first=layout == "page_first")
    tokens = sequence(1, pages, pool.page_size)
    expected = [pool.page_bytes(p) for p in range(pages)]
    assert built.backup(tokens, first_page=0) == len(tokens)
    hit_tokens, moved = built.prefetch("r1", tokens, first_page=pages)
    assert (hit_tokens, moved) == (len(tokens), pages)
    wrong = [p for p in range(pages) if pool.page_bytes(pages + p) != expected[p]]
    assert wrong == []
    assert built.prefetch("r2", sequence(2, 3, pool.page_size), first_page=pages) == (0, 0)


@pytest.mark.parametrize("v1", [True, False], ids=["batch_v1", "batch_generic"])
@pytest.mark.parametrize("tier", TIERS)
def test_sglangs_three_storage_threads_at_once_lose_no_page_and_load_no_wrong_byte(
        tier: str, v1: bool, tmp_path: Path, controllers: list[StorageController]) -> None:
    """SGL-4: the backup thread writes while a prefetch thread reads and an existence thread checks
    what it acknowledged: every acknowledged sequence is found whole and loads its own bytes."""
    seqs, pages = 24, 6
    pool = HostPool(pages=seqs * pages + 2 * pages)
    pool.fill_random(seed=11)
    built = controller(controllers, extra(tier, tmp_path, v1=v1, slots=16), pool)
    expected = {n: [pool.page_bytes(n * pages + p) for p in range(pages)] for n in range(seqs)}
    acked: list[int] = []
    cond = threading.Condition()
    problems: list[str] = []

    def backup() -> None:
        for n in range(seqs):
            done = built.backup(sequence(n, pages, pool.page_size), first_page=n * pages)
            with cond:
                acked.append(n) if done == pages * pool.page_size else problems.append(f"backup {n}: {done}")
                cond.notify_all()

    def each_acked(check: Any) -> None:
        for i in range(seqs):
            with cond:
                cond.wait_for(lambda i=i: len(acked) > i or len(acked) + len(problems) >= seqs)  # type: ignore[misc]  # a bound default
                if len(acked) <= i:
                    return
                n = acked[i]
            check(n)

    def read(n: int) -> None:
        dest = seqs * pages  # this thread's own host pages
        found = built.prefetch(f"read-{n}", sequence(n, pages, pool.page_size), first_page=dest)
        if found != (pages * pool.page_size, pages):
            problems.append(f"read {n}: {found}")
        problems.extend(f"read {n}: page {p} wrong" for p in range(pages) if pool.page_bytes(dest + p) != expected[n][p])

    def exists(n: int) -> None:
        hits = built.storage_backend.batch_exists(_hashes(n, pages, pool))
        if hits != pages:
            problems.append(f"exists {n}: {hits}")

    threads = [threading.Thread(target=backup), threading.Thread(target=each_acked, args=(read,)),
               threading.Thread(target=each_acked, args=(exists,))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
    assert len(acked) == seqs


def _hashes(n: int, pages: int, pool: HostPool) -> list[str]:
    return list(get_storage_hash_str(sequence(n, pages, pool.page_size), None, page_size=pool.page_size))


@pytest.mark.parametrize("v1", [True, False], ids=["batch_v1", "batch_generic"])
def test_a_tier_failing_half_its_jobs_loads_no_wrong_byte(v1: bool, tmp_path: Path, controllers: list[StorageController]) -> None:
    """SGL-5: over a tier that fails every second job, SGLang transfers only pages the tier loaded:
    0 wrong bytes, and host pages not loaded stay as they were (SGLang recomputes them)."""
    seqs, pages = 12, 5
    pool = HostPool(pages=seqs * pages + pages)
    pool.fill_random(seed=3)
    built = controller(controllers, extra("tests.adapters.sglang.sglang_tiers:half_failing", tmp_path, v1=v1, slots=4), pool)
    backed = {n: built.backup(sequence(n, pages, pool.page_size), first_page=n * pages) for n in range(seqs)}
    dest = seqs * pages
    wrong_bytes, loaded_pages = 0, 0
    for n in range(seqs):
        sentinel = bytes([0xA5]) * len(pool.page_bytes(0))
        for p in range(pages):
            pool.set_from_flat_data_page((dest + p) * pool.page_size,
                                         torch.frombuffer(bytearray(sentinel), dtype=torch.uint8).view(pool.dtype))
        _, moved = built.prefetch(f"r{n}", sequence(n, pages, pool.page_size), first_page=dest)
        for p in range(pages):
            got = pool.page_bytes(dest + p)
            if p < moved:
                loaded_pages += 1
                wrong_bytes += sum(a != b for a, b in zip(got, pool.page_bytes(n * pages + p), strict=True))
            else:
                assert got == sentinel, f"sequence {n}: page {p} was not loaded yet its host page changed"
    tier = built.storage_backend.hosted_tier
    assert isinstance(tier, HalfFailing) and tier.failed_jobs > 0
    assert wrong_bytes == 0
    assert 0 < loaded_pages < seqs * pages  # some pages loaded, some recomputed
    assert sum(backed.values()) < seqs * pages * pool.page_size  # SGLang saw failed backups (all or nothing per batch)
