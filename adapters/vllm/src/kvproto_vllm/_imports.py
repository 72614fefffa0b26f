"""Importing vLLM's modules with an error that says what is missing and how to install it.

vLLM's ``tiering/base.py``, ``tiering/example/manager.py`` and ``kv_offload/base.py`` import with
vLLM alone; ``tiering/fs/manager.py``, ``cpu/manager.py`` and ``tiering/manager.py`` reach vLLM's
connector metrics, hence ``vllm.config`` and transformers. Where vLLM was installed without its
dependencies (``pip install --no-deps vllm``), those imports fail deep inside vLLM; this module
turns that into one error naming the missing module and the supported installation.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MODULE_LEVEL", "SUPPORTED_INSTALL", "import_vllm"]

#: How kvproto-vllm is supported: vLLM with its own dependencies.
SUPPORTED_INSTALL = "vLLM 0.33 with its dependencies: pip install 'kvproto-vllm[vllm]'"
#: The vLLM modules kvproto_vllm's own modules import when they load; ``kvproto_vllm/__init__.py``
#: imports them through :func:`import_vllm` first, so a missing one is named with the remedy.
MODULE_LEVEL = ("vllm.v1.kv_offload.base", "vllm.v1.kv_offload.config", "vllm.v1.kv_offload.tiering.base")


def import_vllm(module: str, needed_by: str) -> ModuleType:
    """``module`` imported; a ModuleNotFoundError (``name`` = the missing module) that names what
    ``needed_by`` lacks and :data:`SUPPORTED_INSTALL` when it cannot be."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if missing == "vllm":
            how = "vLLM is not installed"
        else:
            how = f"{missing!r} is not installed (vLLM installed without its dependencies?)"
        raise ModuleNotFoundError(
            f"{needed_by} needs vLLM's {module}, which cannot be imported: {how}; "
            f"the supported installation is {SUPPORTED_INSTALL}",
            name=missing,
        ) from exc
