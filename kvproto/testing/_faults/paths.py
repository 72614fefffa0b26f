"""The optional paths of a backend, kept by the kit's backend wrappers (KIT-25).

A :class:`~kvproto.tierkit.BlobBackend` may offer optional protocols that
:class:`~kvproto.tierkit.BlobTier` then uses instead of its per-blob calls: an existence check that
opens what it finds (:class:`~kvproto.tierkit.HeldExistence`), one call closing many held handles
(``close_held_many``), existence batches (:class:`~kvproto.tierkit.ExistenceBatches`), batched
publishes and reads (:class:`~kvproto.tierkit.PublishBatches`, :class:`~kvproto.tierkit.ReadBatches`).
A wrapper offering none of them would run the tier's per-blob fallbacks under the kit, never the
paths it runs in production; one offering all of them would invent paths the backend lacks. So a
wrapper (:class:`~kvproto.testing.ForwardingBackend` and every subclass) is built, per inner
backend, as a subclass offering exactly the paths the inner backend offers, each from the nearest
class of the wrapper's hierarchy that says how it runs that path (``_path_mixins``: the kit's
:class:`~kvproto.testing.FaultyBackend` applies its faults per blob inside a batch). A wrapper
subclass that changes a per-blob call a path stands in for (``publish`` for ``publish_many``),
without saying how it runs that path, does not offer the path: the tier then goes through the
changed per-blob call, as the subclass meant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvproto.tierkit import ExistenceBatches, HeldExistence, PublishBatches, ReadBatches
from kvproto.tierkit._blob_holds import HeldCloses

__all__ = ["PATH_PROTOCOLS", "REPLACES", "offered_paths", "with_paths"]

PATH_PROTOCOLS: tuple[type, ...] = (HeldExistence, HeldCloses, ExistenceBatches, PublishBatches, ReadBatches)
"""The optional synchronous paths a BlobTier takes when its backend offers them (TIERKIT-5..7, -11)."""

REPLACES: Mapping[type, tuple[str, ...]] = {
    HeldExistence: ("sizes", "open_held"),
    HeldCloses: ("close_held",),
    ExistenceBatches: ("sizes",),
    PublishBatches: ("publish",),
    ReadBatches: ("read_into",),
}
"""The per-blob calls each path stands in for."""

_COMPOSED: dict[tuple[type, frozenset[type]], type] = {}
"""The wrapper classes built so far, per (wrapper class, paths offered): at most a few per class."""


def offered_paths(inner: object) -> frozenset[type]:
    """The protocols of :data:`PATH_PROTOCOLS` that ``inner`` offers."""
    return frozenset(p for p in PATH_PROTOCOLS if isinstance(inner, p))


def _owner(cls: type, path: type) -> tuple[type, type] | None:
    """The nearest class of ``cls``'s hierarchy whose ``_path_mixins`` says how it runs ``path``, and that mixin."""
    for klass in cls.__mro__:
        mixins: Mapping[type, type] | None = klass.__dict__.get("_path_mixins")
        if mixins is not None and path in mixins:
            return klass, mixins[path]
    return None


def _changes_a_call_of(cls: type, owner: type, path: type) -> bool:
    """Whether a class of ``cls``'s hierarchy below ``owner`` redefines a per-blob call ``path`` stands in for."""
    for klass in cls.__mro__:
        if klass is owner:
            return False
        if any(name in klass.__dict__ for name in REPLACES[path]):
            return True
    return False


def with_paths(cls: type[Any], inner: object) -> type[Any]:
    """``cls``, or the subclass of it that offers exactly the optional paths ``inner`` offers (KIT-25)."""
    if cls.__dict__.get("_composed", False):
        return cls
    offered = offered_paths(inner)
    key = (cls, offered)
    composed = _COMPOSED.get(key)
    if composed is not None:
        return composed
    mixins: list[type] = []
    for path in PATH_PROTOCOLS:
        if path not in offered:
            continue
        found = _owner(cls, path)
        if found is None or _changes_a_call_of(cls, found[0], path):
            continue
        if found[1] not in mixins:
            mixins.append(found[1])
    composed = cls
    if mixins:
        names = "+".join(m.__name__.lstrip("_") for m in mixins)
        composed = type(cls.__name__, (*mixins, cls), {
            "__module__": cls.__module__,
            "__qualname__": f"{cls.__qualname__}[{names}]",
            "__doc__": cls.__doc__,
            "_composed": True,
        })
    _COMPOSED[key] = composed
    return composed
