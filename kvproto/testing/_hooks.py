"""Every backdoor hook the kit can use, read from the kit's code: its signature, what it does, and
what leaving it out leaves unchecked (KIT-5, KIT-16).

A hook is a public method of a kit base class (``SecondaryTierTests``, ``PrimaryTierTests``) whose
body, past its docstring, only raises ``NotImplementedError``: the stub meaning "not available"
that a test class (or ``TierSpec.hooks``) replaces. A check that needs one says so in its
``@check(..., hooks=...)`` and skips, naming it, where it is missing. ``kvproto conform --hooks``
prints :func:`hooks_table`, the table in docs/writing-a-tier.md (a test keeps the two equal).
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvproto.testing._checks.primary.suite import PrimaryTierTests
from kvproto.testing._checks.secondary.suite import SecondaryTierTests
from kvproto.testing._harness.base import KitBase
from kvproto.testing._harness.decorator import CheckInfo, checks_of
from kvproto.testing._harness.tier_spec import TierKind

__all__ = ["Hook", "hook_signature", "hooks_of", "hooks_table", "kit_hooks"]

_BASES: dict[TierKind, type[KitBase]] = {"secondary": SecondaryTierTests, "primary": PrimaryTierTests}


@dataclass(frozen=True)
class Hook:
    """One backdoor hook of the kit base class of ``kind``: ``signature`` as the test class defines
    it (``self`` left out), ``summary`` its docstring's first sentence, ``checks`` those that skip
    without it (KIT-5)."""

    kind: TierKind
    name: str
    signature: str
    summary: str
    checks: tuple[CheckInfo, ...]

    @property
    def clauses(self) -> list[str]:
        """The clauses of :attr:`checks`, in check order, each once."""
        return list(dict.fromkeys(c.clause for c in self.checks))


def _is_stub(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s body, past its docstring, is only ``raise NotImplementedError``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        return False
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def hook_signature(base: type[KitBase], name: str) -> str:
    """``name(tier: SecondaryTier, key: OffloadKey, data: bytes) -> None``: the hook's signature on
    ``base`` as a test class defines it, without ``self`` (KIT-16)."""
    signature = inspect.signature(getattr(base, name))
    params = list(signature.parameters.values())[1:]
    shown = ", ".join(
        p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {p.annotation}" for p in params
    )
    returns = signature.return_annotation
    return f"{name}({shown})" + ("" if returns is inspect.Signature.empty else f" -> {returns}")


_ROLE = re.compile(r":(?:meth|class|func|attr):`~?(?:[\w.]+\.)?(\w+)`")
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?: |$)")


def _summary(fn: Callable[..., Any]) -> str:
    """The first sentence of ``fn``'s docstring on one line, in Markdown (``x`` as `x`, a Sphinx
    role as its name)."""
    doc = " ".join((inspect.getdoc(fn) or "").split())
    doc = _ROLE.sub(r"`\1`", doc).replace("``", "`")
    end = _SENTENCE_END.search(doc)
    return doc if end is None else doc[: end.start() + 1]


def hooks_of(kind: TierKind) -> list[Hook]:
    """Every backdoor hook of the kit base class of ``kind``, by name (KIT-5)."""
    base = _BASES[kind]
    checks = checks_of(base)
    found: list[Hook] = []
    for name in sorted(dir(base)):
        fn = getattr(base, name)
        if name.startswith(("_", "test")) or not inspect.isfunction(fn) or not _is_stub(fn):
            continue
        needing = tuple(info for info in checks.values() if name in info.hooks)
        found.append(Hook(kind, name, hook_signature(base, name), _summary(fn), needing))
    return found


def kit_hooks() -> list[Hook]:
    """Every hook of both kit base classes: the secondary's, then the primary's."""
    return [*hooks_of("secondary"), *hooks_of("primary")]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def hooks_table() -> str:
    """The Markdown table of every hook: kind, signature, what it does, and the clauses and checks
    that go unchecked (skipped, naming the hook) without it (KIT-5). docs/writing-a-tier.md holds it."""
    lines = [
        "| tier | hook | what it does | without it, unchecked |",
        "|---|---|---|---|",
    ]
    for hook in kit_hooks():
        if hook.checks:
            skipped = "; ".join(
                f"{clause}: " + ", ".join(f"`{c.name}`" for c in hook.checks if c.clause == clause)
                for clause in hook.clauses
            )
        else:
            skipped = "none: no check skips without it (where defined, the checks using it go further)"
        lines.append(f"| {hook.kind} | `{_cell(hook.signature)}` | {_cell(hook.summary)} | {skipped} |")
    return "\n".join(lines) + "\n"
