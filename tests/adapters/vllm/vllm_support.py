"""Test support: make vLLM 0.33's tiering modules importable in kvproto's test environment.

kvproto's CI installs the vLLM 0.33.0 wheel with ``--no-deps`` plus a few pure-Python packages
(numpy, psutil, msgspec, pyzmq, urllib3, regex) and the CPU build of torch (``.ci/run``, ``./dev``).
That makes ``vllm.v1.kv_offload.base``, ``tiering.base`` and ``tiering.example.manager`` importable.
``tiering.fs.manager`` (through ``file_mapper``), ``cpu.manager`` and ``tiering.manager`` also
import two leaf modules under ``vllm.distributed.kv_transfer.kv_connector.v1.offloading``:

* ``metrics``, for ``OffloadingConnectorStats`` (the managers' Prometheus counters);
* ``canonical_mapping``, for ``canonical_format_id`` (only with the canonical KV layout).

Their package ``__init__``s (``vllm.distributed`` and the four below it) import the whole connector
stack, ``vllm.config`` and transformers. :func:`install` puts a stand-in for exactly these two leaf
modules in ``sys.modules`` (so none of the five ``__init__``s runs), and nothing else; it does
nothing where vLLM's full dependency set is installed (the real ``metrics`` module imports).
Transformers alone is not enough: kvproto's CI installs it for LMCache's ``basic_check``. None of this is in
the adapter: ``kvproto_vllm`` imports vLLM as a user's vLLM installation provides it.

Run the kvproto command line with the stand-ins: ``python -m tests.adapters.vllm.vllm_support conform vllm-fs``.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["LEAVES", "StandInStats", "install", "main", "real_connector_imports"]

_PACKAGE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
LEAVES = (f"{_PACKAGE}.metrics", f"{_PACKAGE}.canonical_mapping")
"""The two modules replaced, and only they."""


class StandInStats:
    """``OffloadingConnectorStats`` as the tiering code calls it: counters, gauges and histograms
    kept in one dict (no Prometheus, no connector)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def increase_counter(self, name: str, value: float = 1, labelvalues: tuple[str, ...] = ()) -> None:
        bucket = self.data.setdefault(name, {})
        bucket[labelvalues] = bucket.get(labelvalues, 0) + value

    def set_gauge(self, name: str, value: float, labelvalues: tuple[str, ...] = ()) -> None:
        self.data.setdefault(name, {})[labelvalues] = value

    def observe_histogram(self, name: str, value: float, labelvalues: tuple[str, ...] = ()) -> None:
        self.data.setdefault(name, {}).setdefault(labelvalues, []).append(value)

    def is_empty(self) -> bool:
        return not self.data

    def aggregate(self, other: StandInStats) -> StandInStats:
        for name, bucket in other.data.items():
            self.data.setdefault(name, {}).update(bucket)
        return self


def _canonical_format_id(kv_cache_layout: str) -> str:
    raise NotImplementedError("the canonical KV layout is not used in kvproto's tests")


def real_connector_imports() -> bool:
    """Whether vLLM's own connector ``metrics`` module imports here (vLLM's dependencies are all
    installed); a failed attempt leaves none of the failing modules in ``sys.modules``."""
    if LEAVES[0] in sys.modules:
        return not _is_stand_in(sys.modules[LEAVES[0]])
    if importlib.util.find_spec("transformers") is None:
        return False
    try:
        importlib.import_module(LEAVES[0])
    except Exception:  # ModuleNotFoundError for a missing dependency, or whatever vllm.config raises without one
        return False
    return True


def _is_stand_in(module: types.ModuleType) -> bool:
    return (module.__doc__ or "").startswith("kvproto test stand-in")


def install() -> list[str]:
    """Put the two stand-ins in ``sys.modules`` unless vLLM's dependencies are all there; the names installed."""
    if real_connector_imports():
        return []
    done: list[str] = []
    for name in LEAVES:
        if name in sys.modules:
            continue
        module = types.ModuleType(name, "kvproto test stand-in (tests/adapters/vllm/vllm_support.py)")
        if name.endswith(".metrics"):
            module.OffloadingConnectorStats = StandInStats  # type: ignore[attr-defined]  # a module built at run time
        else:
            module.canonical_format_id = _canonical_format_id  # type: ignore[attr-defined]  # a module built at run time
        sys.modules[name] = module
        done.append(name)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    """``kvproto ARGV...`` in this process, with the stand-ins installed."""
    from tests.cli import kvproto_cli

    install()
    return kvproto_cli(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
