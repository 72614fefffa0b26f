"""The ``kvproto`` command line as a user reaches it: through its console-script entry point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

__all__ = ["kvproto_cli"]


def kvproto_cli(argv: Sequence[str]) -> int:
    """Run ``kvproto ARGV...`` in this process (the installed ``kvproto`` script's ``main``); its exit code."""
    (script,) = entry_points(group="console_scripts", name="kvproto")
    main: Callable[[Sequence[str]], int] = script.load()
    return main(list(argv))
