"""The CPU tier's data plane: device <-> CPU slot copies as non-blocking jobs (CPU-11..CPU-13).

Device KV cache layout. The device cache is one tensor or a list of per-layer
tensors, all with the same shape, dtype and device, contiguous, with the block
index on dim 0: ``layer[b]`` is block ``b`` of that layer. With ``L`` layers of
``P`` bytes per block, a CPU slot holds the block of every layer back to back,
layer 0 first: slot bytes ``[l * P, (l + 1) * P)`` are ``layer[l][b]``'s bytes
in memory order. ``L * P`` must equal the tier's ``block_bytes`` (CPU-11).

Copies. On CUDA, jobs run in order on one dedicated stream, which first waits
for the current stream (so a store reads what the model wrote). A store
gathers the blocks on the device (``index_select`` per layer into a staging
tensor laid out like the slots), then copies each run of consecutive slots to
the pinned slot buffer in one ``copy_``; a load does the reverse
(``index_copy_`` on the device). One CUDA event per job; ``poll`` queries it
and never blocks. On CPU tensors the same jobs run, in order, on one worker
thread, copying each run of blocks consecutive on both sides in pieces: one
layer of up to about 4 MiB of the run's blocks, each piece one serial copy over
numpy views of the same memory, the GIL released (not a torch ``copy_`` whose
parallel region waits for torch's threads). The copy kernel (``copy_kernel``,
``_copy_kernels``) writes with non-temporal stores where kvproto-cpu's small C
extension is built (a load smaller than the last-level cache excepted), else it
is ``numpy.copyto``. With an intra-op budget of two threads or more, a helper
thread shares the pieces: each thread takes the next one until none is left, so
a helper that starts late copies less instead of delaying the job. Every byte is
read and written once.

Completion (CPU-12). ``poll`` reports each finished job once. Unless the
handler was built with ``complete_tier=False``, a finished store calls the
tier's ``complete_store(keys, success)`` and a finished load its
``complete_load(keys)`` (pins are released whether or not the copy worked).
Stores are accepted only for keys WRITING in the given slots and loads only
for keys PINNED in them (``prepare_load`` first), so a load never reads a
block that is not READY.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy
import numpy.typing
import torch

from kvproto import OffloadKey
from kvproto.errors import ConfigurationError, InvalidArgumentError, TierMisuseError

from kvproto_cpu._copy_kernels import CopyKernel, RowCopy, pick_kernels
from kvproto_cpu._tier import BlockState, CpuTier

__all__ = ["CpuTransferHandler", "DeviceLayout", "TransferOutcome"]

_log = logging.getLogger("kvproto_cpu")

_Direction = Literal["store", "load"]

_PIECE_BYTES = 4 << 20  # CPU copies: the size of one shared piece (_copy_shared)
_Piece = tuple[numpy.typing.NDArray[numpy.uint8], numpy.typing.NDArray[numpy.uint8]]  # (destination, source)


@dataclass(frozen=True, slots=True)
class TransferOutcome:
    """One finished job, reported once by :meth:`CpuTransferHandler.poll` (CPU-12)."""

    job_id: int
    direction: _Direction
    keys: tuple[OffloadKey, ...]
    success: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceLayout:
    """The validated shape of a device KV cache (CPU-11)."""

    layers: tuple[torch.Tensor, ...]
    num_blocks: int
    layer_block_bytes: int
    device: torch.device

    @property
    def num_layers(self) -> int:
        """How many layer tensors the cache has (``L``, CPU-11)."""
        return len(self.layers)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over all layers, ``L * P``: must equal the tier's ``block_bytes`` (CPU-11)."""
        return self.num_layers * self.layer_block_bytes

    @staticmethod
    def of(device_cache: torch.Tensor | Sequence[torch.Tensor]) -> DeviceLayout:
        """Validate ``device_cache``; ConfigurationError naming the mismatch (CPU-11)."""
        layers = (device_cache,) if isinstance(device_cache, torch.Tensor) else tuple(device_cache)
        if not layers:
            raise ConfigurationError("device KV cache: no layer tensors given")
        first = layers[0]
        for index, layer in enumerate(layers):
            if not isinstance(layer, torch.Tensor):
                raise ConfigurationError(
                    f"device KV cache layer {index} is a {type(layer).__name__}, not a torch.Tensor"
                )
            if layer.dim() < 1 or layer.shape[0] < 1:
                raise ConfigurationError(
                    f"device KV cache layer {index} has shape {tuple(layer.shape)}; "
                    "expected the block index on dim 0 and at least one block"
                )
            if layer.dtype != first.dtype:
                raise ConfigurationError(
                    f"device KV cache layer {index} has dtype {layer.dtype}, layer 0 has {first.dtype}"
                )
            if layer.shape != first.shape:
                raise ConfigurationError(
                    f"device KV cache layer {index} has shape {tuple(layer.shape)}, "
                    f"layer 0 has {tuple(first.shape)}"
                )
            if layer.device != first.device:
                raise ConfigurationError(
                    f"device KV cache layer {index} is on {layer.device}, layer 0 on {first.device}"
                )
            if not layer.is_contiguous():
                raise ConfigurationError(f"device KV cache layer {index} is not contiguous")
            if layer.device.type not in ("cpu", "cuda"):
                raise ConfigurationError(
                    f"device KV cache layer {index} is on {layer.device}; only cpu and cuda are supported"
                )
        num_blocks = int(first.shape[0])
        layer_block_bytes = first[0].numel() * first.element_size()
        return DeviceLayout(layers, num_blocks, layer_block_bytes, first.device)

    def as_bytes(self) -> tuple[torch.Tensor, ...]:
        """Each layer as a uint8 ``[num_blocks, layer_block_bytes]`` view (no copy)."""
        return tuple(
            layer.view(torch.uint8).reshape(self.num_blocks, self.layer_block_bytes)
            for layer in self.layers
        )


def _runs(first: Sequence[int], second: Sequence[int] | None) -> list[tuple[int, int, int]]:
    """Split index pairs into runs ``(first_start, second_start, length)``.

    A run continues while ``first`` (and ``second``, if given) both step by
    one. With ``second=None`` the second start is the position in ``first``.
    Found with one vectorised pass, not a Python loop over blocks.
    """
    n = len(first)
    if n == 0:
        return []
    a = torch.tensor(first, dtype=torch.int64)
    breaks = (a[1:] - a[:-1]) != 1
    if second is not None:
        b = torch.tensor(second, dtype=torch.int64)
        breaks |= (b[1:] - b[:-1]) != 1
    starts = [0, *(torch.nonzero(breaks).flatten() + 1).tolist(), n]
    return [
        (first[s], second[s] if second is not None else s, e - s)
        for s, e in itertools.pairwise(starts)
    ]


@dataclass(slots=True)
class _Job:
    job_id: int
    direction: _Direction
    keys: tuple[OffloadKey, ...]
    future: Future[None] | None = None
    event: torch.cuda.Event | None = None
    error: str | None = None


class CpuTransferHandler:
    """Moves blocks between a device KV cache and a :class:`CpuTier`'s slots (CPU-11..CPU-13).

    ``submit_store(keys, slots, device_block_ids)`` copies device blocks into
    the slots ``prepare_store`` reserved; ``submit_load(keys, slots,
    device_block_ids)`` copies pinned slots (``prepare_load``) into device
    blocks. Both return a job id at once; ``poll()`` returns the jobs finished
    since the last call without blocking; ``wait()`` blocks until all are.
    ``max_staging_bytes`` bounds the device staging memory of one CUDA copy
    step (a job is split into chunks of at most that many bytes).
    ``copy_kernel`` picks how CPU tensors are copied (CPU-13): ``"streaming"``
    (non-temporal stores; ConfigurationError where this install did not build
    it), ``"numpy"`` (``numpy.copyto``), or ``"auto"``: streaming where built,
    except for loads smaller than the last-level cache, whose lines the model
    reads next (``numpy.copyto``). Ignored where the cache is on CUDA.
    """

    def __init__(
        self,
        tier: CpuTier,
        device_cache: torch.Tensor | Sequence[torch.Tensor],
        *,
        complete_tier: bool = True,
        max_staging_bytes: int = 256 << 20,
        copy_kernel: Literal["auto", "streaming", "numpy"] = "auto",
    ) -> None:
        layout = DeviceLayout.of(device_cache)
        self._cuda = layout.device.type == "cuda"
        # A cache on CUDA is copied by CUDA copies: the CPU kernels never run there, nor need building (an
        # unknown name is still refused).
        unused = self._cuda and copy_kernel in ("auto", "streaming")
        self._kernels = pick_kernels("numpy" if unused else copy_kernel)
        if layout.block_bytes != tier.block_bytes:
            raise ConfigurationError(
                f"device KV cache block is {layout.num_layers} layer(s) x "
                f"{layout.layer_block_bytes} bytes = {layout.block_bytes} bytes, "
                f"but the CPU tier's block_bytes is {tier.block_bytes}"
            )
        if max_staging_bytes < 1:
            raise ConfigurationError(f"max_staging_bytes must be >= 1, got {max_staging_bytes}")
        self._tier = tier
        self._layout = layout
        self._device_bytes = layout.as_bytes()
        self._slots = tier.tensor
        self._slots_by_layer = tier.tensor.view(
            tier.num_slots, layout.num_layers, layout.layer_block_bytes
        )
        # CPU copies go through numpy views of the same memory (no copy): the copy kernels are serial and
        # release the GIL, so two threads share a job's pieces without torch's parallel regions.
        self._host_slots = self._slots_by_layer.numpy()
        self._host_layers = () if self._cuda else tuple(layer.detach().numpy() for layer in self._device_bytes)
        self._complete_tier = complete_tier
        self._chunk_blocks = max(1, max_staging_bytes // tier.block_bytes)
        # CPU copies: one piece is one layer of up to this many blocks of a run (about 4 MiB), so two
        # threads sharing the pieces end within a fraction of a millisecond of each other.
        self._piece_blocks = max(1, _PIECE_BYTES // layout.layer_block_bytes)
        self._ids = itertools.count(1)
        self._closed = False
        self._jobs: dict[int, _Job] = {}
        self._stream: torch.cuda.Stream | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._helper: ThreadPoolExecutor | None = None  # CPU copies: shares the pieces (_copy_shared)
        if self._cuda:
            # torch.cuda.Stream's constructor is unannotated.
            self._stream = torch.cuda.Stream(device=layout.device)  # type: ignore[no-untyped-call]  # unannotated in torch
            if not tier.pinned:
                _log.warning(
                    "%s: the slot buffer is not pinned; device copies will block", tier.name
                )
        else:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-tier-copy")
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-tier-copy-helper")

    @property
    def copy_kernel(self) -> CopyKernel | Literal["cuda"]:
        """The kernel copying pieces between CPU tensors (CPU-13); ``"cuda"`` where the cache is on CUDA."""
        return "cuda" if self._cuda else self._kernels.name

    @property
    def layout(self) -> DeviceLayout:
        """The validated device KV cache layout (CPU-11)."""
        return self._layout

    def pending_jobs(self) -> int:
        """Jobs submitted and not yet reported by ``poll``."""
        return len(self._jobs)

    # ------------------------------------------------------------------ submission

    def submit_store(
        self,
        keys: Sequence[OffloadKey],
        slots: Sequence[int],
        device_block_ids: Sequence[int],
    ) -> int:
        """Start copying device blocks into the WRITING slots of ``keys`` (CPU-12).

        Raises TierMisuseError naming the key if a key is not WRITING in its
        slot or a slot is out of range, InvalidArgumentError for mismatched
        lengths or a device block id out of range; nothing is started then.
        """
        keys_t, slots_t, ids_t = self._check("store", keys, slots, device_block_ids)
        return self._start("store", keys_t, slots_t, ids_t)

    def submit_load(
        self,
        keys: Sequence[OffloadKey],
        slots: Sequence[int],
        device_block_ids: Sequence[int],
    ) -> int:
        """Start copying the PINNED slots of ``keys`` into device blocks (CPU-12).

        Only keys pinned by ``prepare_load`` in exactly those slots are
        accepted (TierMisuseError naming the key otherwise), so loads start
        only from READY blocks.
        """
        keys_t, slots_t, ids_t = self._check("load", keys, slots, device_block_ids)
        return self._start("load", keys_t, slots_t, ids_t)

    def _check(
        self,
        direction: _Direction,
        keys: Sequence[OffloadKey],
        slots: Sequence[int],
        device_block_ids: Sequence[int],
    ) -> tuple[tuple[OffloadKey, ...], tuple[int, ...], tuple[int, ...]]:
        keys_t, slots_t, ids_t = tuple(keys), tuple(slots), tuple(device_block_ids)
        if not len(keys_t) == len(slots_t) == len(ids_t):
            raise InvalidArgumentError(
                f"submit_{direction}: {len(keys_t)} keys, {len(slots_t)} slots and "
                f"{len(ids_t)} device block ids; they must match"
            )
        tier = self._tier
        want = BlockState.WRITING if direction == "store" else BlockState.PINNED
        for key, slot in zip(keys_t, slots_t, strict=True):
            tier.check_slot(slot)
            state = tier.state(key)
            if state is not want or tier.slot_of(key) != slot:
                hint = "prepare_store" if direction == "store" else "prepare_load"
                raise TierMisuseError(
                    f"submit_{direction}: key {key!r} is {state.name} in slot "
                    f"{tier.slot_of(key)}, not {want.name} in slot {slot} ({hint} it first)",
                    key=key,
                )
        if len(set(slots_t)) != len(slots_t):
            raise InvalidArgumentError(f"submit_{direction}: a slot appears twice in {slots_t}")
        for block in ids_t:
            if type(block) is not int or not 0 <= block < self._layout.num_blocks:
                raise InvalidArgumentError(
                    f"submit_{direction}: device block id {block!r} is out of range "
                    f"0..{self._layout.num_blocks - 1}"
                )
        if direction == "load" and len(set(ids_t)) != len(ids_t):
            raise InvalidArgumentError(
                f"submit_load: a device block id appears twice in {ids_t}"
            )
        return keys_t, slots_t, ids_t

    def _start(
        self,
        direction: _Direction,
        keys: tuple[OffloadKey, ...],
        slots: tuple[int, ...],
        ids: tuple[int, ...],
    ) -> int:
        if self._closed:
            raise TierMisuseError(f"submit_{direction} after shutdown of the transfer handler")
        job = _Job(next(self._ids), direction, keys)
        self._jobs[job.job_id] = job
        if self._worker is not None:
            copy = self._host_store if direction == "store" else self._host_load
            job.future = self._worker.submit(copy, slots, ids)
            return job.job_id
        try:
            job.event = self._cuda_copy(direction, slots, ids)
        except Exception as exc:  # a failed copy fails the job, not the caller
            _log.exception("%s job %d could not start", direction, job.job_id)
            job.error = f"{type(exc).__name__}: {exc}"
            self._drain_after_failure()
        return job.job_id

    def _drain_after_failure(self) -> None:
        """Wait for copies already queued by a job that failed half way (error path only).

        The failed job's slots go back to the tier when ``poll`` reports it;
        a copy still queued could otherwise write into a slot already reused.
        """
        if self._stream is None:  # pragma: no cover - CUDA plane only
            return
        try:
            self._stream.synchronize()
        except Exception:  # the device is in trouble; the job is failed already
            _log.exception("could not drain the copy stream after a failed job")

    # ------------------------------------------------------------------ host copies

    def _host_store(self, slots: tuple[int, ...], ids: tuple[int, ...]) -> None:
        self._copy_shared(self._pieces("store", slots, ids), self._kernels.copy)

    def _host_load(self, slots: tuple[int, ...], ids: tuple[int, ...]) -> None:
        copy = self._kernels.for_load(len(ids) * self._layout.block_bytes)
        self._copy_shared(self._pieces("load", slots, ids), copy)

    def _pieces(self, direction: _Direction, slots: tuple[int, ...], ids: tuple[int, ...]) -> Iterator[_Piece]:
        """The job's ``(destination, source)`` pieces, made as they are taken: per run of blocks consecutive on
        both sides, per layer, up to ``_piece_blocks`` blocks (CPU-13)."""
        rows = self._host_slots
        span = self._piece_blocks
        store = direction == "store"
        for block, slot, length in _runs(ids, slots):
            # The run's bounds once, not per layer: one pair for every scattered block (a job's worst case).
            bounds = [(lo, min(length, lo + span)) for lo in range(0, length, span)]
            for layer, blocks in enumerate(self._host_layers):
                for lo, hi in bounds:
                    in_slots, in_cache = rows[slot + lo : slot + hi, layer], blocks[block + lo : block + hi]
                    yield (in_slots, in_cache) if store else (in_cache, in_slots)

    def _copy_shared(self, pieces: Iterator[_Piece], copy: RowCopy) -> None:
        """Copy every ``(destination, source)`` piece, each with one serial call of ``copy`` (the GIL
        released inside it), this thread and the helper each taking the next piece until none is left (CPU-13).

        Work is shared, not split in fixed halves: a helper that starts late (its CPU busy elsewhere, e.g.
        with torch's own threads still spinning after a parallel region) takes fewer pieces instead of
        making the job wait for its half, and one never started is cancelled, not waited for. The helper
        is used only where torch may use two threads or more (``torch.get_num_threads()``).

        A failure ends the job's copying: the thread that failed stops the other from taking another
        piece (it finishes the one it is copying), and the error raised is this thread's own if it failed,
        else the helper's."""
        lock = threading.Lock()
        failed = threading.Event()

        def drain() -> None:
            while True:
                with lock:  # a generator is not safe to advance from two threads at once
                    piece = None if failed.is_set() else next(pieces, None)
                if piece is None:
                    return
                copy(*piece)

        def drain_or_stop() -> None:
            try:
                drain()
            except BaseException:
                failed.set()
                raise

        helper = self._helper
        if helper is None or torch.get_num_threads() < 2:
            for destination, source in pieces:
                copy(destination, source)
            return
        other = helper.submit(drain_or_stop)
        try:
            drain_or_stop()
        except BaseException:
            if not other.cancel():
                other.exception()  # wait for the piece it is copying; this thread's error is the job's
            raise
        if not other.cancel():  # started: wait for the piece it is copying (and its error, if any)
            other.result()

    # ------------------------------------------------------------------ CUDA copies

    def _cuda_copy(
        self, direction: _Direction, slots: tuple[int, ...], ids: tuple[int, ...]
    ) -> torch.cuda.Event:
        stream = self._stream
        if stream is None:  # pragma: no cover - set whenever the cache is on CUDA
            raise InvalidArgumentError("no CUDA stream")
        device = self._layout.device
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            step = self._chunk_blocks
            for start in range(0, len(ids), step):
                chunk_slots = slots[start : start + step]
                chunk_ids = ids[start : start + step]
                index = torch.tensor(chunk_ids, dtype=torch.int64).pin_memory()
                index = index.to(device, non_blocking=True)
                if direction == "store":
                    self._cuda_store_chunk(chunk_slots, index)
                else:
                    self._cuda_load_chunk(chunk_slots, index)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
            event.record(stream)
        return event

    def _cuda_store_chunk(self, slots: tuple[int, ...], index: torch.Tensor) -> None:
        n = len(slots)
        layout = self._layout
        staging = torch.empty(
            (n, layout.num_layers, layout.layer_block_bytes), dtype=torch.uint8, device=layout.device
        )
        for layer, source in enumerate(self._device_bytes):
            staging[:, layer].copy_(source.index_select(0, index))
        rows = staging.view(n, layout.block_bytes)
        for slot, row, length in _runs(slots, None):
            self._slots[slot : slot + length].copy_(rows[row : row + length], non_blocking=True)

    def _cuda_load_chunk(self, slots: tuple[int, ...], index: torch.Tensor) -> None:
        n = len(slots)
        layout = self._layout
        staging = torch.empty((n, layout.block_bytes), dtype=torch.uint8, device=layout.device)
        for slot, row, length in _runs(slots, None):
            staging[row : row + length].copy_(self._slots[slot : slot + length], non_blocking=True)
        by_layer = staging.view(n, layout.num_layers, layout.layer_block_bytes)
        for layer, target in enumerate(self._device_bytes):
            target.index_copy_(0, index, by_layer[:, layer])

    # ------------------------------------------------------------------ completion

    def _finished(self, job: _Job) -> TransferOutcome | None:
        if job.error is not None:
            return TransferOutcome(job.job_id, job.direction, job.keys, False, job.error)
        if job.future is not None:
            if not job.future.done():
                return None
            exc = job.future.exception()
            error = None if exc is None else f"{type(exc).__name__}: {exc}"
            if exc is not None:
                _log.error("%s job %d failed: %s", job.direction, job.job_id, error)
            return TransferOutcome(job.job_id, job.direction, job.keys, exc is None, error)
        if job.event is None:
            return None
        try:
            # Event.query is unannotated in torch; it returns bool without blocking.
            finished = job.event.query()  # type: ignore[no-untyped-call]  # unannotated in torch
        except RuntimeError as exc:  # a CUDA error surfaces here: fail the job, never raise (CPU-12)
            error = f"{type(exc).__name__}: {exc}"
            _log.error("%s job %d failed: %s", job.direction, job.job_id, error)
            return TransferOutcome(job.job_id, job.direction, job.keys, False, error)
        if finished:
            return TransferOutcome(job.job_id, job.direction, job.keys, True)
        return None

    def poll(self) -> list[TransferOutcome]:
        """The jobs finished since the last call, each reported once, in submission order (CPU-12).

        Never blocks. Drives the tier's ``complete_store`` / ``complete_load``
        unless built with ``complete_tier=False``.
        """
        done: list[TransferOutcome] = []
        for job in list(self._jobs.values()):
            outcome = self._finished(job)
            if outcome is None:
                continue
            del self._jobs[job.job_id]
            done.append(outcome)
            if self._complete_tier:
                self._complete(outcome)
        return done

    def _complete(self, outcome: TransferOutcome) -> None:
        """Tell the tier; a key it no longer knows is logged and skipped, never raised."""
        tier = self._tier

        def finish(keys: tuple[OffloadKey, ...]) -> None:
            if outcome.direction == "store":
                tier.complete_store(keys, outcome.success)
            else:
                tier.complete_load(keys)

        try:
            finish(outcome.keys)
            return
        except TierMisuseError:
            pass
        # The whole batch was refused before any change: finish key by key.
        for key in outcome.keys:
            try:
                finish((key,))
            except TierMisuseError as exc:
                _log.warning("%s job %d: %s", outcome.direction, outcome.job_id, exc)

    def wait(self) -> list[TransferOutcome]:
        """Block until every submitted job has finished, then :meth:`poll`."""
        for job in list(self._jobs.values()):
            if job.future is not None:
                try:
                    job.future.result()
                except Exception:  # reported by poll
                    pass
            elif job.event is not None:
                job.event.synchronize()
        return self.poll()

    def shutdown(self) -> list[TransferOutcome]:
        """Finish every job, report them, and stop the worker thread."""
        self._closed = True
        outcomes = self.wait()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        if self._helper is not None:
            self._helper.shutdown(wait=True)
        return outcomes

