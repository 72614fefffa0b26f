"""``kvproto typecheck TARGET``: strict mypy proves a tier class satisfies its protocol (KIT-12).

TARGET is ``pkg.module:Class``, a ``pkg.module:factory`` (its tier's class
is checked), or an installed tier name. The protocol is the one the class
claims (a protocol it subclasses, else the shape of its methods: a primary
tier has ``prepare_store``), or ``--protocol``. Exit code 0 only when the
class conforms and its module has no strict mypy error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Literal

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    parser.add_argument("target", metavar="TARGET", help="pkg.module:Class, pkg.module:factory or an installed tier name")
    parser.add_argument(
        "--protocol",
        choices=("primary", "secondary"),
        default=None,
        help="the protocol to check against (default: the one the class claims)",
    )
    parser.add_argument("--show-mypy", action="store_true", help="also print mypy's own output")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the verdict as JSON")


def _resolve_class(target: str) -> tuple[type, str | None]:
    """The class TARGET names, and the protocol kind its spec says (if it is a factory or tier name)."""
    from kvproto._cli.targets import import_target, resolve_target

    if ":" in target:
        obj = import_target(target)
        if isinstance(obj, type) and (hasattr(obj, "lookup") or hasattr(obj, "submit_store")):
            return obj, None
    spec = resolve_target(target)
    return spec.resolved_class(), spec.kind


def run(args: argparse.Namespace) -> int:
    from kvproto._cli.conform import have_kit

    if not have_kit("typecheck"):
        return 2
    from rich.console import Console

    from kvproto._cli.mypy_check import claimed_protocol, typecheck_class
    from kvproto.errors import KvprotoError

    console = Console()
    try:
        cls, kind = _resolve_class(args.target)
    except (KvprotoError, ImportError, AttributeError) as exc:  # the last two: an entry point that cannot load
        console.print(
            f"kvproto typecheck: cannot resolve {args.target!r}: {exc}",
            style="red", markup=False, emoji=False, highlight=False, soft_wrap=True,  # one line
        )
        return 2
    claimed = args.protocol or kind or claimed_protocol(cls)
    protocol: Literal["primary", "secondary"] = "primary" if claimed == "primary" else "secondary"
    with console.status(f"strict mypy: does {cls.__qualname__} satisfy the {protocol} tier protocol?"):
        result = typecheck_class(cls, protocol=protocol, label=args.target)
    if args.show_mypy:
        console.print(result.mypy_output, markup=False, highlight=False)
    if args.json is not None:
        args.json.write_text(json.dumps({"class": f"{cls.__module__}:{cls.__qualname__}", **result.to_json()}, indent=2))
    name = f"{cls.__module__}.{cls.__qualname__}"
    if result.problems:
        console.print(f"[bold red]{name} does not satisfy {result.protocol}:")
        for problem in result.problems:
            console.print(f"  - {problem}", markup=False, highlight=False)
    else:
        console.print(f"[green]{name} satisfies {result.protocol}[/] (strict mypy)")
    if result.module_errors:
        # Apart from the protocol: strict errors anywhere else in the tier's own module (KIT-12).
        console.print(f"[bold red]other strict mypy errors in your module {cls.__module__}:")
        for problem in result.module_errors:
            console.print(f"  - {problem}", markup=False, highlight=False)
    if result.unchecked_module is not None:
        console.print(f"not checked: {result.unchecked_module}", style="yellow", markup=False, highlight=False)
    return 0 if result.passed else 1
