"""The BlobTier engine over an in-memory backend as ``kvproto conform`` targets, for ``./dev mutate
blobtier`` (tests/kvproto/testing/mutation.py): the same set-up as tests/kvproto/tierkit/test_blob_kit.py
(a FaultyBackend over a MemoryBackend, the backdoor hooks through them), as TierSpecs the kit's command
line runs. ``blob_private``: the index answers, no eviction, jobs reported whole (``partial_jobs=False``:
the only spec that runs that path; the shared ones report partial jobs); ``blob_shared``: shared mode with a
48-block byte budget, every capability declared; ``blob_async``: that shared mode over an
AsyncBlobBackend (tests/kvproto/tierkit/test_blob_async.py's AsyncMemory) wrapped in a FaultyBackend
(its jobs run on worker threads through the backend's synchronous face); ``blob_loop``: the same
without the wrapper, so jobs run on the engine's event loop (the obj tier's path), with the hooks that
need no FaultyBackend (seed, read, corrupt, reopen, reopen_other_layout); ``blob_loop_bytes``: jobs
on the loop over an AsyncBytes (``read_bytes``: the one-pass copy and check) over a FaultyBackend, every
hook; ``blob_held``: ``blob_shared`` over a HeldMemory (a MemoryBackend offering HeldReads), so HITs are
held (TIERKIT-6, TIER-26)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from kvproto import OffloadKey, SecondaryTier, envelope as env
from kvproto.testing import FaultyBackend, FaultyJobs, OpFault, TierSpec
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend

from tests.kvproto.tierkit.test_blob_async import AsyncMemory, _memory as _async_parts

__all__ = [
    "AsyncBytes", "HeldMemory", "blob_async", "blob_held", "blob_loop", "blob_loop_bytes", "blob_private", "blob_shared",
    "fs_direct", "fs_private", "obj_heads_only",
]


def _parts(tier: object) -> tuple[BlobTier, FaultyBackend, MemoryBackend]:
    assert isinstance(tier, BlobTier)
    if not isinstance(tier.backend, FaultyBackend) or not isinstance(tier.backend.inner, MemoryBackend):
        return _async_parts(tier)
    return tier, tier.backend, tier.backend.inner


def _reopen(tier: object, buffer: memoryview) -> SecondaryTier:
    blob, faulty, memory = _parts(tier)
    if faulty.inner is memory:
        return FaultyJobs(FaultyBackend(memory), buffer, blob.blob_config, name=blob.name)
    return FaultyJobs(AsyncMemory(memory), buffer, blob.blob_config, name=blob.name, wrap=FaultyBackend)


def _other_layout(config: BlobTierConfig) -> BlobTierConfig:
    return replace(config, layout={**config.layout, "kvproto-kit": "another layout"})


def _reopen_other_layout(tier: object, buffer: memoryview) -> SecondaryTier:
    """A new instance over the same storage for another model layout (another namespace, TIER-22)."""
    blob, faulty, memory = _parts(tier)
    config = _other_layout(blob.blob_config)
    if faulty.inner is memory:
        return FaultyJobs(FaultyBackend(memory), buffer, config, name=blob.name)
    return FaultyJobs(AsyncMemory(memory), buffer, config, name=blob.name, wrap=FaultyBackend)


def _read_block(tier: object, key: OffloadKey) -> bytes | None:
    blob, _, memory = _parts(tier)
    data = memory.blobs.get(blob.name_of(key))
    return None if data is None else data[env.HEADER_BYTES :]


def _seed_block(tier: object, key: OffloadKey, data: bytes) -> None:
    blob, _, memory = _parts(tier)
    memory.blobs[blob.name_of(key)] = env.encode(key, data, blob.namespace)
    blob.vouch_for([key])


def _fail_next_jobs(tier: object, n: int) -> None:
    _parts(tier)[1].fail_next_jobs(n)


def _fail_keys(tier: object, keys: Iterable[OffloadKey]) -> None:
    _parts(tier)[1].fail_keys(keys)


def _corrupt_on_read(tier: object, keys: Iterable[OffloadKey]) -> None:
    blob, _, memory = _parts(tier)
    for key in keys:
        name = blob.name_of(key)
        data = memory.blobs.get(name)
        if data is None:
            continue
        damaged = data[:-1] + bytes([data[-1] ^ 0xFF])
        if isinstance(memory, HeldMemory):
            memory.damage_in_place(name, damaged)  # as a write into the file: open handles see it
        else:
            memory.blobs[name] = damaged


_IO_OPS = ("publish", "read_into", "sizes", "delete", "close")


def _fail_io(tier: object, n: int) -> None:
    """The next ``n`` calls of each of the backend's reads, writes and its close (publish, read_into, sizes,
    delete, close) raise ``OSError(EIO)``, through the FaultyBackend the tier was built over; 0 disarms
    them (TIER-31, TIER-38, TIER-39). Job and key faults stay armed."""
    faulty = _parts(tier)[1]
    faulty.disarm_ops()
    for op in _IO_OPS if n > 0 else ():
        faulty.arm(OpFault(op, count=n))


_HOOKS: dict[str, Callable[..., Any]] = {
    "reopen": _reopen,
    "reopen_other_layout": _reopen_other_layout,
    "read_block": _read_block,
    "seed_block": _seed_block,
    "fail_next_jobs": _fail_next_jobs,
    "fail_keys": _fail_keys,
    "corrupt_on_read": _corrupt_on_read,
    "fail_io": _fail_io,
}


def _spec(name: str, config: BlobTierConfig) -> TierSpec:
    def build(buffer: memoryview) -> SecondaryTier:
        return FaultyJobs(FaultyBackend(MemoryBackend()), buffer, config, name=name)

    return TierSpec(
        name, "secondary", build, hooks=_HOOKS, tier_class=BlobTier,
        description=f"BlobTier(FaultyBackend(MemoryBackend()), {config!r})",
    )


def blob_private() -> TierSpec:
    """BlobTier over a MemoryBackend, private mode (the index answers, no eviction), jobs reported whole."""
    return _spec("blob-private", BlobTierConfig(partial_jobs=False))


def blob_async() -> TierSpec:
    """BlobTier over an AsyncBlobBackend (MemoryBackend behind coroutines), shared mode with a 48-block byte
    budget, its operations and jobs timed out as a remote tier's are (so it declares ``job_time_bound_s``)."""
    config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64), op_timeout_s=5.0, job_timeout_s=10.0)

    def build(buffer: memoryview) -> SecondaryTier:
        return FaultyJobs(AsyncMemory(MemoryBackend()), buffer, config, name="blob-async", wrap=FaultyBackend)

    return TierSpec(
        "blob-async", "secondary", build, hooks=_HOOKS, tier_class=BlobTier,
        description=f"BlobTier(AsyncMemory(MemoryBackend()), {config!r}, wrap=FaultyBackend)",
    )


def _loop_memory(tier: object) -> tuple[BlobTier, MemoryBackend]:
    assert isinstance(tier, BlobTier)
    memory = tier.backend.inner.inner  # type: ignore[attr-defined]  # LoopBackend -> AsyncMemory -> MemoryBackend
    assert isinstance(memory, MemoryBackend)
    return tier, memory


def _loop_reopen(tier: object, buffer: memoryview) -> SecondaryTier:
    blob, memory = _loop_memory(tier)
    return BlobTier(AsyncMemory(memory), buffer, blob.blob_config, name=blob.name)


def _loop_reopen_other_layout(tier: object, buffer: memoryview) -> SecondaryTier:
    blob, memory = _loop_memory(tier)
    return BlobTier(AsyncMemory(memory), buffer, _other_layout(blob.blob_config), name=blob.name)


def _loop_read(tier: object, key: OffloadKey) -> bytes | None:
    blob, memory = _loop_memory(tier)
    data = memory.blobs.get(blob.name_of(key))
    return None if data is None else data[env.HEADER_BYTES :]


def _loop_seed(tier: object, key: OffloadKey, data: bytes) -> None:
    blob, memory = _loop_memory(tier)
    memory.blobs[blob.name_of(key)] = env.encode(key, data, blob.namespace)
    blob.vouch_for([key])


def _loop_corrupt(tier: object, keys: Iterable[OffloadKey]) -> None:
    blob, memory = _loop_memory(tier)
    for key in keys:
        name = blob.name_of(key)
        data = memory.blobs.get(name)
        if data is not None:
            memory.blobs[name] = data[:-1] + bytes([data[-1] ^ 0xFF])


def blob_loop() -> TierSpec:
    """BlobTier over an AsyncBlobBackend with no wrapper (jobs on the engine's loop), shared with a budget."""
    config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64))

    def build(buffer: memoryview) -> SecondaryTier:
        return BlobTier(AsyncMemory(MemoryBackend()), buffer, config, name="blob-loop")

    hooks: dict[str, Callable[..., Any]] = {
        "reopen": _loop_reopen, "reopen_other_layout": _loop_reopen_other_layout,
        "read_block": _loop_read, "seed_block": _loop_seed, "corrupt_on_read": _loop_corrupt,
    }
    return TierSpec(
        "blob-loop", "secondary", build, hooks=hooks, tier_class=BlobTier,
        description=f"BlobTier(AsyncMemory(MemoryBackend()), {config!r})",
    )


class AsyncBytes(AsyncMemory):
    """AsyncMemory over a FaultyBackend, offering ``read_bytes`` (an AsyncBlobBytes: the whole blob as stored,
    as obstore's GET hands it over)."""

    def __init__(self, inner: FaultyBackend) -> None:
        super().__init__(inner)  # type: ignore[arg-type]  # a BlobBackend: AsyncMemory only forwards to it
        self.faulty = inner

    async def read_bytes(self, name: str) -> memoryview:
        (size,) = self.faulty.sizes([name])
        if size is None:
            raise FileNotFoundError(name)
        blob = memoryview(bytearray(size))
        self.faulty.read_into(name, (blob,))
        return blob


def blob_loop_bytes() -> TierSpec:
    """``blob_loop`` whose asynchronous backend offers ``read_bytes`` (a load copies and checks the body in one
    pass, TIERKIT-3) over a FaultyBackend: jobs on the engine's loop with every hook, I/O faults included."""
    config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64))

    def build(buffer: memoryview) -> SecondaryTier:
        return FaultyJobs(AsyncBytes(FaultyBackend(MemoryBackend())), buffer, config, name="blob-loop-bytes")

    return TierSpec(
        "blob-loop-bytes", "secondary", build, hooks=_HOOKS, tier_class=BlobTier,
        description=f"BlobTier(AsyncBytes(FaultyBackend(MemoryBackend())), {config!r})",
    )


def blob_shared() -> TierSpec:
    """BlobTier over a MemoryBackend, shared mode with a 48-block byte budget (every capability declared), its
    jobs timed out on the worker pools (``job_time_bound_s`` from both timeouts)."""
    return _spec("blob-shared", BlobTierConfig(
        shared=True, max_bytes=48 * (env.HEADER_BYTES + 64), op_timeout_s=5.0, job_timeout_s=10.0,
    ))


class HeldMemory(MemoryBackend):
    """A MemoryBackend that keeps a blob readable from a HIT to its load (HeldReads, TIERKIT-6): a handle
    is the blob's bytes when opened (immutable, so a later delete or replace leaves them readable)."""

    @property
    def held_reads(self) -> bool:
        return True

    def __init__(self) -> None:
        super().__init__()
        self._open: dict[str, list[list[bytes]]] = {}  # name -> the handles open on it (a one-item list each)

    def open_held(self, name: str) -> object:
        with self._lock:
            data = self.blobs.get(name)
            if data is None:
                raise FileNotFoundError(name)
            handle = [data]
            self._open.setdefault(name, []).append(handle)
        return (name, handle)

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        assert isinstance(handle, tuple)
        data: bytes = handle[1][0]
        return self.scatter(data, buffers)

    def close_held(self, handle: object) -> None:
        assert isinstance(handle, tuple)
        with self._lock:
            still = [h for h in self._open.get(handle[0], []) if h is not handle[1]]
            if still:
                self._open[handle[0]] = still
            else:
                self._open.pop(handle[0], None)

    def damage_in_place(self, name: str, data: bytes) -> None:
        """Overwrite blob ``name``'s bytes in place, as a write into its file: open handles read them too."""
        with self._lock:
            self.blobs[name] = data
            for handle in self._open.get(name, []):
                handle[0] = data


def blob_held() -> TierSpec:
    """blob_shared over a HeldMemory: HITs are held (holds_hits declared; the TIER-26 checks run)."""
    config = BlobTierConfig(shared=True, max_bytes=48 * (env.HEADER_BYTES + 64))

    def build(buffer: memoryview) -> SecondaryTier:
        return FaultyJobs(FaultyBackend(HeldMemory()), buffer, config, name="blob-held")

    return TierSpec(
        "blob-held", "secondary", build, hooks=_HOOKS, tier_class=BlobTier,
        description=f"BlobTier(FaultyBackend(HeldMemory()), {config!r})",
    )
def fs_private() -> TierSpec:
    """``kvproto_fs``'s kit spec in private mode (the index answers, the restart scan, no eviction): the mode
    tests/impls/fs/test_conformance.py's TestPrivateFsTier runs, for ``./dev mutate fs``, over 4 KiB
    page-aligned rows and with HITs not held (``hold_hits_steps=0``), so loads read by name with O_DIRECT
    (``FileBackend.read_into``; fs_direct's held HITs switch O_DIRECT on a held descriptor instead), one
    writer thread (``write_threads=1``, the smallest pool FS-1 allows) and ``durability="data"`` (an fsync
    before each link, FS-4). It requires TIER-31's failed-sync check (KIT-28): a tier that stops syncing
    fails rather than leaving the check not checked."""
    from kvproto_fs import FsTierConfig
    from kvproto_fs._conformance import fresh_root, fs_spec, kit_tier

    base = fs_spec("fs-private", shared=False, eviction=False)

    def build(buffer: memoryview) -> SecondaryTier:
        config = FsTierConfig(
            root=fresh_root(), shared=False, read_threads=2, write_threads=1, hold_hits_steps=0, durability="data",
        )
        return kit_tier(buffer, config, "fs-private")

    return replace(
        base, factory=build, block_bytes=4096, must_check=frozenset({"test_a_store_whose_sync_fails_is_reported_failed"}),
        description=f"{base.description}, 4 KiB rows, hold_hits_steps=0, write_threads=1, durability='data'",
    )


def fs_direct() -> TierSpec:
    """``kvproto_fs``'s kit spec over 4 KiB page-aligned slot rows, so FileBackend takes its O_DIRECT
    path (the kit's 64-byte rows never do), with a 48-block budget and existence checks at most every
    10 ms (``probe_min_interval_s``, FS-5), for ``./dev mutate fs``. It requires TIER-35's direct-I/O
    check (KIT-28): over these rows FsTier makes direct-I/O calls, so a tier that stops trying O_DIRECT
    fails rather than leaving the check not checked."""
    from kvproto_fs import FsTierConfig
    from kvproto_fs._conformance import fresh_root, fs_spec, kit_tier

    base = fs_spec("fs-direct")

    def build(buffer: memoryview) -> SecondaryTier:
        config = FsTierConfig(
            root=fresh_root(), shared=True, max_bytes=48 * (env.HEADER_BYTES + 4096),
            read_threads=2, write_threads=2, probe_min_interval_s=0.01,
        )
        return kit_tier(buffer, config, "fs-direct")

    return replace(
        base, factory=build, block_bytes=4096, must_check=frozenset({"test_refused_direct_io_still_moves_the_bytes"}),
        description=f"{base.description}, 4 KiB rows, probe_min_interval_s=0.01",
    )


def obj_heads_only() -> TierSpec:
    """``kvproto_obj``'s kit spec with ``list_page_cost`` at its largest (1,000,000: OBJ-11's exchange rate
    never buys a page, so every existence check is a HEAD per name), for ``./dev mutate obj``."""
    from kvproto_obj import ObjTierConfig
    from kvproto_obj._conformance import obj_spec

    config = ObjTierConfig(max_concurrency=8, probe_concurrency=16, prefix="kvproto-kit/obj", list_page_cost=1_000_000)
    return obj_spec("obj-heads-only", config=config, description=f"kvproto_obj.ObjTier over a MemoryStore, {config!r}")
