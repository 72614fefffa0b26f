"""A CrossHair plugin (``--extra_plugin``) that reports how many paths a run explored.

``crosshair check`` prints no path counts, so ``kvproto.testing.scans`` loads this
file into every CrossHair run it starts. It wraps CrossHair's exploration
loop, adds up the iterations and exhaustions, and prints one line to stderr
at exit::

    kvproto-crosshair-stats paths=412 exhausted=0

CrossHair ``exec``-s a plugin file's text, so the text only imports itself
as a module, where the wrapper is installed. If a CrossHair release renames
the loop, nothing is installed and the counts read as unknown; the check
itself is unaffected.
"""

from __future__ import annotations

import atexit
import importlib
import sys
from typing import Any

_MODULE = "kvproto._verification._crosshair_stats"
_totals = {"paths": 0, "exhausted": 0}


def _report() -> None:
    print(
        f"kvproto-crosshair-stats paths={_totals['paths']} exhausted={_totals['exhausted']}",
        file=sys.stderr,
    )


def _install() -> None:
    try:
        from crosshair import core
    except ImportError:  # pragma: no cover - only ever run inside CrossHair
        return
    explore_loop = getattr(core, "explore_loop", None)
    if explore_loop is None:  # pragma: no cover - a CrossHair release without it
        return

    def counting_explore_loop(*args: Any, **kwargs: Any) -> Any:
        result = explore_loop(*args, **kwargs)
        _totals["paths"] += int(getattr(result, "iterations", 0))
        _totals["exhausted"] += int(bool(getattr(result, "exhausted", False)))
        return result

    core.explore_loop = counting_explore_loop
    atexit.register(_report)


if __name__ == _MODULE:
    _install()
else:  # executed by ``crosshair --extra_plugin``: import as a module, which installs it
    importlib.import_module(_MODULE)
