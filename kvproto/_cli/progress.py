"""The live progress display that ``kvproto conform``, ``verify`` and ``simulate`` show."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["progress_display"]


def progress_display(console: Console, label: str, *fields: str, count: bool = False, spinner: bool = False) -> Progress:
    """A display of ``[spinner] label, bar, [done/total], each task field named in fields, elapsed time``
    on ``console``; it stays on the console when it ends (not transient)."""
    columns: list[ProgressColumn] = [SpinnerColumn()] if spinner else []
    columns += [TextColumn(label), BarColumn()]
    if count:
        columns.append(MofNCompleteColumn())
    columns += [TextColumn(f"{{task.fields[{name}]}}") for name in fields]
    columns.append(TimeElapsedColumn())
    return Progress(*columns, console=console, transient=False)
