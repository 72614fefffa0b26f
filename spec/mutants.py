"""Deliberately wrong scans, each breaking one clause, to show that the checks can fail.

The test suite runs every check of :mod:`kvproto.testing.scans` against these
(and ``kvproto verify --prefix/--window`` on each, SCAN-11) and asserts that it
reports a failure: a check that passes a wrong scan proves nothing. Each mutant is one plausible mistake, the first one a bug that
shipped in a real engine.

Each is built from the source of the shipped scan (:mod:`kvproto.scan`) with ONE textual edit,
recorded here: the edit is provably the only difference between the mutant and the scan it breaks
(:func:`one_edit` refuses an edit that does not match exactly once).
"""

from __future__ import annotations
import __future__

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from kvproto.scan import Decision, maximal_prefix_lookup, sliding_window_lookup

__all__ = ["prefix_stops_at_retry", "window_defers_on_any_pending"]


def one_edit(reference: Callable[..., Decision], name: str, old: str, new: str, doc: str) -> Callable[..., Any]:
    """``reference`` compiled again, named ``name`` and documented ``doc``, from its own source with
    the one occurrence of ``old`` replaced by ``new``, in (a copy of) its module's namespace.

    Raises ValueError unless ``old`` occurs exactly once in the source.
    """
    source = textwrap.dedent(inspect.getsource(reference))
    if source.count(old) != 1:
        raise ValueError(f"{name}: {old!r} occurs {source.count(old)} times in {reference.__name__}, not once")
    source = source.replace(old, new).replace(f"def {reference.__name__}(", f"def {name}(", 1)
    namespace = dict(reference.__globals__)
    flags = __future__.annotations.compiler_flag
    exec(compile(source, f"<{name}: {reference.__name__} with one edit>", "exec", flags, dont_inherit=True), namespace)
    mutant: Callable[..., Any] = namespace[name]
    mutant.__module__ = __name__
    mutant.__qualname__ = name
    mutant.__doc__ = doc
    return mutant


prefix_stops_at_retry = one_edit(
    maximal_prefix_lookup,
    "prefix_stops_at_retry",
    "retries += 1\n                if cause is None:\n                    cause = result\n",
    "retries += 1\n                if cause is None:\n                    cause = result\n                break\n",
    """Breaks SCAN-2: stops at the first RETRY, so the tiers never start
    their asynchronous checks for the keys after it.""",
)

window_defers_on_any_pending = one_edit(
    sliding_window_lookup,
    "window_defers_on_any_pending",
    "if pending_at < end:",
    "if pending_at < n:",
    """Breaks SCAN-8: a MISS does not clear the pending mark, so a HIT_PENDING
    outside the chosen window still defers it.""",
)
