"""The ``kvproto`` command line for tier authors, engine integrators and operators.

* ``kvproto conform [TIER ...]``: run the conformance kit against installed or
  given tiers, clause by clause (KIT-*); ``--explain CHECK`` says what a check does.
* ``kvproto typecheck TARGET``: strict mypy proves a tier class satisfies its protocol (KIT-12).
* ``kvproto verify``: check ``kvproto.scan``, or an engine's own scans, against
  the specification with CrossHair and Hypothesis (SCAN-1..SCAN-12).
* ``kvproto bench [NAME ...]``: run the benchmarks side by side and print their
  ratios. The benchmarks live in a source checkout, not in the wheel: ``bench``
  is listed only when run from a checkout's root (``./dev kvproto bench``).
* ``kvproto simulate``: drive an engine-like loop over a tier stack through a
  TieringManager, with faults, and check nothing wrong is served and no tier is
  useless (MGR-16); ``--report out.html``, ``--metrics-port PORT`` (``kvproto[metrics]``).

Each subcommand lives in its own module (``kvproto._cli.<name>``) and is
imported only when used, so ``kvproto --help`` stays fast and the contract
never imports torch. ``kvproto NAME --help`` describes a subcommand's options.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from kvproto._version import __version__

__all__ = ["console", "main"]

# subcommand -> (module, help). Each module provides
#   add_arguments(parser: argparse.ArgumentParser) -> None
#   run(args: argparse.Namespace) -> int
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "conform": ("kvproto._cli.conform", "run the conformance kit against tiers"),
    "typecheck": ("kvproto._cli.typecheck", "check with strict mypy that a tier satisfies its protocol"),
    "verify": ("kvproto._cli.verify", "check the scans against the spec (CrossHair + Hypothesis)"),
    "bench": ("kvproto._cli.bench", "run benchmarks side by side and print their ratios"),
    "simulate": ("kvproto._cli.simulate", "drive an engine-like loop over a tier stack, with faults"),
}


#: Subcommands that run only from a source checkout, with what they need there.
CHECKOUT_ONLY: dict[str, str] = {"bench": "benchmarks/__init__.py"}


def _available(name: str) -> bool:
    """True unless ``name`` runs only from a checkout and the current directory is not one."""
    from pathlib import Path

    needs = CHECKOUT_ONLY.get(name)
    return needs is None or (Path.cwd() / needs).is_file()


def _description() -> str:
    """The module docstring without the bullets of subcommands not available here."""
    import re

    text = (__doc__ or "").replace("``", "")
    for name in CHECKOUT_ONLY:
        if not _available(name):
            text = re.sub(rf"^\* kvproto {name}\b.*?(?=^\* |^$)", "", text, flags=re.MULTILINE | re.DOTALL)
    return text


def _load(module: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    mod = importlib.import_module(module)
    add_arguments: Callable[[argparse.ArgumentParser], None] = mod.add_arguments
    run: Callable[[argparse.Namespace], int] = mod.run
    return add_arguments, run


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvproto`` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="kvproto",
        description=_description(),  # every subcommand listed, described
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvproto {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in args_list if not a.startswith("-")), None)
    runner: Callable[[argparse.Namespace], int] | None = None
    if chosen in CHECKOUT_ONLY and not _available(chosen):
        print(
            f"kvproto {chosen}: runs from the root of a kvproto source checkout (it needs "
            f"{CHECKOUT_ONLY[chosen]}, which is not in the wheel): git clone kvproto, then ./dev kvproto {chosen}",
            file=sys.stderr,
        )
        return 2
    for name, (module, help_text) in SUBCOMMANDS.items():
        if not _available(name):
            continue  # absent from an install's help
        sp = sub.add_parser(name, help=help_text, description=help_text)  # a module may say more
        if name == chosen:
            try:
                add_arguments, runner = _load(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                parser.error(f"'{name}' is not available in this build of kvproto")
            add_arguments(sp)
    args = parser.parse_args(args_list)
    if args.command is None or runner is None:
        parser.print_help()
        return 2
    return runner(args)


def console() -> None:
    """The ``kvproto`` console script (and ``python -m kvproto``): :func:`main`, then exit with its code.

    Where a tier call the kit bounds hung in this process (KIT-27: a shutdown that never returned), the
    tier's threads may still be running, and the interpreter's exit would wait for them forever once the
    verdict is out: then the exit handlers run (a kit run's servers stopped, its keys removed) and the
    process ends without waiting for those threads, saying so on stderr."""
    code = main()
    driver = sys.modules.get("kvproto.testing._harness.driver")
    hung: list[str] = driver.hung_tier_classes() if driver is not None else []
    if not hung:
        raise SystemExit(code)
    print(f"kvproto: the shutdown of {', '.join(hung)} hung (KIT-27); not waiting for its threads", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)
