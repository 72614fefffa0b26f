"""``MooncakeOps``: every request the tier makes to Mooncake Store, one method each (MC-9).

The tier calls Mooncake only through this class, so a subclass can count requests and fail them
as a cluster does (the conformance spec's ``KitMooncakeOps``); production uses it as is. Each
method is one call of the client's (``MooncakeDistributedStore``), run on a worker thread, never
the scheduler's. Mooncake answers with status codes, not exceptions: ``0`` or a byte count is
success, a negative number an ``ErrorCode`` (:data:`ERRORS` names those the tier acts on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = [
    "ERRORS", "INVALID_PARAMS", "OBJECT_ALREADY_EXISTS", "OBJECT_HAS_LEASE", "OBJECT_NOT_FOUND", "RPC_FAIL",
    "TRANSFER_FAIL", "Client", "MooncakeError", "MooncakeOps", "Replica", "error_name",
]

INVALID_PARAMS = -600
"""A request Mooncake refused: an empty value, or a value larger than the buffer given for it."""
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
"""A ``get`` holds a read lease (10 s by default) during which a plain ``remove`` fails."""
TRANSFER_FAIL = -800
RPC_FAIL = -900

ERRORS: Mapping[int, str] = {
    -1: "INTERNAL_ERROR",
    -10: "BUFFER_OVERFLOW",
    -101: "SEGMENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE",
    -400: "INVALID_KEY",
    -500: "WRITE_FAIL",
    INVALID_PARAMS: "INVALID_PARAMS",
    -703: "REPLICA_IS_NOT_READY",
    OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND",
    OBJECT_ALREADY_EXISTS: "OBJECT_ALREADY_EXISTS",
    OBJECT_HAS_LEASE: "OBJECT_HAS_LEASE",
    TRANSFER_FAIL: "TRANSFER_FAIL",
    RPC_FAIL: "RPC_FAIL",
}


def error_name(code: int) -> str:
    """``OBJECT_HAS_LEASE (-706)``: a Mooncake status code in words."""
    return f"{ERRORS.get(code, 'error')} ({code})"


class MooncakeError(OSError):
    """A request Mooncake answered with a negative status: a transient failure of that key (TIERKIT-3)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: Mooncake answered {error_name(code)}")
        self.code = code


class BufferDescriptor(Protocol):
    """Where a memory replica lies (``mooncake.store.Descriptor``)."""

    @property
    def size(self) -> int: ...


class MemoryDescriptor(Protocol):
    """A memory replica (``mooncake.store.MemoryDescriptor``)."""

    @property
    def buffer_descriptor(self) -> BufferDescriptor: ...


class DiskDescriptor(Protocol):
    """A disk replica (``mooncake.store.DiskDescriptor``)."""

    @property
    def object_size(self) -> int: ...


class Replica(Protocol):
    """One replica of a key (``mooncake.store.ReplicaDescriptor``)."""

    @property
    def status(self) -> object: ...

    def is_memory_replica(self) -> bool: ...

    def get_memory_descriptor(self) -> MemoryDescriptor: ...

    def get_disk_descriptor(self) -> DiskDescriptor: ...


class Client(Protocol):
    """What the tier uses of ``mooncake.store.MooncakeDistributedStore`` (typed here: the wheel ships no types)."""

    def setup(self, local_hostname: str, metadata_server: str, global_segment_size: int, local_buffer_size: int,
              protocol: str, device_name: str, master_server_address: str) -> int: ...

    def register_buffer(self, buffer_ptr: int, size: int) -> int: ...

    def unregister_buffer(self, buffer_ptr: int) -> int: ...

    def batch_put_from_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], config: object = ...) -> list[int]: ...

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: object = ...) -> list[int]: ...

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]: ...

    def put(self, key: str, value: bytes, config: object = ...) -> int: ...

    def get(self, key: str) -> bytes: ...

    def get_size(self, key: str) -> int: ...

    def batch_is_exist(self, keys: list[str]) -> list[int]: ...

    def batch_get_replica_desc(self, keys: list[str]) -> Mapping[str, Sequence[Replica]]: ...

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]: ...

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int: ...

    def close(self) -> int: ...


class MooncakeOps:
    """The requests of the tier (MC-9); a subclass may count them or fail them (raise, or answer an error code).

    ``replicate``: the ``ReplicateConfig`` a put carries (``None``: Mooncake's default, one replica).
    """

    def put_from(self, client: Client, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                 replicate: object | None = None) -> list[int]:
        """``batch_put_from_multi_buffers``: each key's value gathered from its registered buffers; a code per key."""
        if replicate is None:
            return client.batch_put_from_multi_buffers(keys, ptrs, sizes)
        return client.batch_put_from_multi_buffers(keys, ptrs, sizes, replicate)

    def put(self, client: Client, key: str, value: bytes, replicate: object | None = None) -> int:
        """``put`` of a small value through the client's own buffer (the layout manifest)."""
        return client.put(key, value) if replicate is None else client.put(key, value, replicate)

    def get_into(self, client: Client, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        """``batch_get_into``: each key's value into its registered buffer; the bytes read, or a code, per key."""
        return client.batch_get_into(keys, ptrs, sizes)

    def get(self, client: Client, key: str) -> bytes:
        """``get`` through the client's own buffer (``b''``: no such key)."""
        return client.get(key)

    def size(self, client: Client, key: str) -> int:
        """``get_size``: the value's size, or a code."""
        return client.get_size(key)

    def exist(self, client: Client, keys: list[str]) -> list[int]:
        """``batch_is_exist``: 1 present, 0 absent, negative an error, per key."""
        return client.batch_is_exist(keys)

    def replicas(self, client: Client, keys: list[str]) -> Mapping[str, Sequence[Replica]]:
        """``batch_get_replica_desc``: each present key's replica descriptors (absent keys are left out)."""
        return client.batch_get_replica_desc(keys)

    def remove(self, client: Client, keys: list[str], *, force: bool) -> list[int]:
        """``batch_remove``: a code per key (``force`` ignores read leases)."""
        return client.batch_remove(keys, force)

    def remove_matching(self, client: Client, regex: str, *, force: bool) -> int:
        """``remove_by_regex``: how many keys it removed, or a code."""
        return client.remove_by_regex(regex, force)
