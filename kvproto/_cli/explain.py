"""``kvproto conform [TARGET] --explain CHECK``: what a kit check does, and how to run it in your own
pytest (KIT-16).

It prints the check's docstring, the clause it verifies, the file and line of
the kit's source that defines it, the capabilities and backdoor hooks it needs
(each hook's signature, and whether TARGET has them), and a test file to paste
into the author's own suite that runs the very same check against TARGET.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import kvproto
from kvproto._cli.targets import _required_positional, import_target, installed_tiers, one_line
from kvproto.errors import ConfigurationError
from kvproto.testing._checks.primary.suite import PrimaryTierTests
from kvproto.testing._checks.secondary.suite import SecondaryTierTests
from kvproto.testing._harness.base import KitBase
from kvproto.testing._harness.decorator import CheckInfo, checks_of
from kvproto.testing._harness.driver import resolve_capabilities
from kvproto.testing._harness.tier_spec import TierKind, TierSpec, shut_down_probe
from kvproto.testing._hooks import hook_signature

__all__ = ["Source", "defined_at", "explain", "find_check", "known_clauses", "source_of"]

_BASES: dict[TierKind, type[KitBase]] = {"secondary": SecondaryTierTests, "primary": PrimaryTierTests}

#: Where each name used in a hook's annotations comes from, for the snippet's imports.
_IMPORTS = {
    "SecondaryTier": "from kvproto import SecondaryTier",
    "PrimaryTier": "from kvproto import PrimaryTier",
    "OffloadKey": "from kvproto import OffloadKey",
    "Iterable": "from collections.abc import Iterable",
    "Sequence": "from collections.abc import Sequence",
}


def check_name(name: str) -> str:
    """``name`` as the kit knows it: with its ``test_`` prefix."""
    return name if name.startswith("test_") else f"test_{name}"


def find_check(name: str, kind: TierKind | None) -> dict[TierKind, CheckInfo]:
    """The check called ``name`` (with or without ``test_``), by the kind of tier it applies to."""
    wanted = check_name(name)
    kinds: list[TierKind] = ["secondary", "primary"] if kind is None else [kind]
    found: dict[TierKind, CheckInfo] = {}
    for k in kinds:
        info = checks_of(_BASES[k]).get(wanted)
        if info is not None:
            found[k] = info
    return found


def known_checks(kind: TierKind | None) -> list[str]:
    """Every check name, for a tier of ``kind`` (either kind if None)."""
    kinds: list[TierKind] = ["secondary", "primary"] if kind is None else [kind]
    names: list[str] = []
    for k in kinds:
        names += [n for n in checks_of(_BASES[k]) if n not in names]
    return names


def known_clauses(kind: TierKind | None) -> list[str]:
    """Every clause a kit check verifies, for a tier of ``kind`` (either kind if None), in the
    contract's order (by family, then number)."""
    kinds: list[TierKind] = ["secondary", "primary"] if kind is None else [kind]
    found = {info.clause for k in kinds for info in checks_of(_BASES[k]).values()}

    def order(clause: str) -> tuple[str, int]:
        family, _, number = clause.rpartition("-")
        return family, int(number) if number.isdigit() else 0

    return sorted(found, key=order)


def defined_at(kind: TierKind, check: str) -> str:
    """``kvproto/testing/....py:LINE``: where the kit's source defines ``check`` for a tier of
    ``kind`` (a path below the folder kvproto is installed in, else absolute) (KIT-16)."""
    fn = inspect.unwrap(getattr(_BASES[kind], check))
    path = Path(inspect.getsourcefile(fn) or inspect.getfile(fn)).resolve()
    line = inspect.getsourcelines(fn)[1]
    root = Path(kvproto.__file__).resolve().parent.parent
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    return f"{shown.as_posix()}:{line}"


@dataclass(frozen=True)
class Source:
    """Where a target's tier comes from, for the snippet: ``from MODULE import NAME``, and whether
    NAME is a TierSpec, a function returning one, or the tier factory itself."""

    module: str
    attr: str
    how: str  # "spec", "spec function" or "factory"


def source_of(target: str) -> Source:
    """How the snippet reaches ``target`` (``pkg.mod:attr`` or an installed tier's entry point)."""
    value = target
    if ":" not in target:
        found = next((ep for ep in installed_tiers() if ep.name == target), None)
        if found is None:
            raise ConfigurationError(f"{target!r} is neither pkg.module:factory nor an installed tier")
        value = found.value
    module, _, attr = value.partition(":")
    obj = import_target(value)
    if isinstance(obj, TierSpec):
        return Source(module, attr, "spec")
    if callable(obj) and _required_positional(obj) == 0:
        try:
            made = obj()
        except Exception as exc:
            raise ConfigurationError(f"{target}: calling it raised {one_line(exc)}") from exc
        if isinstance(made, TierSpec):
            return Source(module, attr, "spec function")
        shut_down_probe(made)
    return Source(module, attr, "factory")


def _class_name(text: str) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", text) if w]
    name = "".join(w[:1].upper() + w[1:] for w in words) or "MyTier"
    return f"Test{name}" if not name[0].isdigit() else f"TestTier{name}"


def _hook_method(base: type[KitBase], hook: str, body: str) -> tuple[list[str], set[str]]:
    """The lines of hook method ``hook`` (the base class's signature) calling ``body``, and the
    names its annotations use."""
    signature = inspect.signature(getattr(base, hook))
    params = list(signature.parameters.values())
    args = ", ".join(p.name for p in params[1:])
    shown = ", ".join(
        p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {p.annotation}" for p in params
    )
    returns = signature.return_annotation
    arrow = "" if returns is inspect.Signature.empty else f" -> {returns}"
    call = body.format(hook=hook, args=args)
    used = set(re.findall(r"[A-Za-z_]\w*", f"{shown} {arrow}"))
    head = f"    def {hook}({shown}){arrow}:"
    if str(returns) in ("None", str(inspect.Signature.empty)) or call.startswith("..."):
        return [head, f"        {call}"], used
    # Through a typed name: the TierSpec's hooks are untyped, and strict mypy rejects returning Any.
    return [head, f"        found: {returns} = {call}", "        return found"], used


def _merged(lines: list[str]) -> list[str]:
    """``from m import a`` and ``from m import b`` as ``from m import a, b``."""
    names: dict[str, list[str]] = {}
    for line in lines:
        module, _, name = line.removeprefix("from ").partition(" import ")
        names.setdefault(module, []).append(name)
    return [f"from {module} import {', '.join(sorted(found))}" for module, found in names.items()]


def snippet(kind: TierKind, info: CheckInfo, source: Source | None, spec: TierSpec | None) -> tuple[str, str]:
    """A test module running ``info``'s check against the target, and the file name to save it as."""
    base = _BASES[kind]
    base_name = base.__name__
    factory_type = "SecondaryTierFactory" if kind == "secondary" else "PrimaryTierFactory"
    imports = {"import pytest"}
    kit_imports = [base_name, factory_type]
    body: list[str] = []
    used: set[str] = set()
    if source is None:  # no target: a placeholder for the author's own factory
        head = [f"from my_package.my_module import make_tier  # your {kind}-tier factory"]
        stem = "my_tier"
        cls = "TestMyTier"
        body += [
            "    @pytest.fixture",
            f"    def tier_factory(self) -> {factory_type}:",
            "        return make_tier",
        ]
        hooks_here: list[str] = []
    else:
        top = source.attr.split(".")[0]
        head = [f"from {source.module} import {top}"]
        stem = re.sub(r"\W+", "_", source.attr.split(".")[-1]).strip("_").lower() or "tier"
        cls = _class_name(spec.name if spec is not None and source.how != "factory" else source.attr.split(".")[-1])
        if source.how == "factory":
            body += [
                "    @pytest.fixture",
                f"    def tier_factory(self) -> {factory_type}:",
                f"        return {source.attr}",
            ]
            hooks_here = []
        else:
            head += ["", f"SPEC = {source.attr}{'()' if source.how == 'spec function' else ''}"]
            body += [
                "    capabilities = SPEC.capabilities",
                "    expected_failures = dict(SPEC.expected_failures)",
                "    limits = SPEC.limits",
                "",
                "    @pytest.fixture",
                f"    def tier_factory(self) -> {factory_type}:",
                "        return SPEC.factory",
            ]
            hooks_here = sorted(spec.hooks) if spec is not None else []
    for hook in hooks_here:
        if not hasattr(base, hook):
            continue
        lines, names = _hook_method(base, hook, 'SPEC.hooks["{hook}"]({args})')
        body += ["", *lines]
        used |= names
    missing = [h for h in info.hooks if h not in hooks_here and hasattr(base, h)]
    for hook in missing:
        lines, _ = _hook_method(base, hook, "...  # reach into your tier's storage")
        comment = f"    # {info.name} needs the backdoor hook {hook}(); without it the check skips:"
        commented = (f"    # {line.strip()}" if i == 0 else f"    #     {line.strip()}" for i, line in enumerate(lines))
        body += ["", comment, *commented]
    extra = sorted({_IMPORTS[n] for n in used if n in _IMPORTS})
    stdlib = _merged([line for line in extra if line.startswith("from collections")])
    kvproto_lines = _merged([line for line in extra if line.startswith("from kvproto ")])
    lines = [
        f'"""Runs the kvproto conformance kit against my tier; `pytest -k {info.name}` runs that one check."""',
        "",
        "from __future__ import annotations",
        "",
        *([*stdlib, ""] if stdlib else []),
        *sorted(imports),
        "",
        *kvproto_lines,
        f"from kvproto.testing import {', '.join(sorted(kit_imports))}",
        *head,
        "",
        "",
        f"class {cls}({base_name}):",
        *body,
    ]
    return "\n".join(lines) + "\n", f"test_{stem}_kit.py"


def explain(check: str, target: str | None, spec: TierSpec | None) -> str:
    """The whole explanation of ``check`` (for ``target``, whose spec is ``spec``, if given)."""
    kind: TierKind | None = spec.kind if spec is not None else None
    found = find_check(check, kind)
    if not found:
        raise ConfigurationError(f"no such kit check: {check}")
    out: list[str] = []
    for k, info in found.items():
        base = _BASES[k]
        doc = inspect.getdoc(getattr(base, info.name)) or info.summary
        where = f" against {target}" if target else ""
        out += [f"{info.name} ({k} tier{where}): verifies clause {info.clause} of spec/CONTRACT.md"]
        out += [f"Defined at {defined_at(k, info.name)}", ""]
        out += [textwrap.indent(doc, "    "), ""]
        out += _needs(info, spec, base)
        out += [
            "Every call the check makes also goes through the kit's driver, which enforces the rules of",
            "KIT-2 on the way (answers are LookupResult members of the right kind, lookups do not block,",
            f"each job is reported once, loads write the right bytes), so a failure may name another clause than {info.clause}.",
        ]
        if info.hypothesis:
            out += [
                "Hypothesis drives it (a state machine): --profile fast|default|thorough (pytest: --kvproto-profile)",
                "sets how hard it searches; a failure lists the steps that led to it.",
            ]
        source = None
        if target is not None:
            source = source_of(target)
        text, filename = snippet(k, info, source, spec)
        out += [
            "",
            f"Reproduce it in your own test suite: save this as {filename}",
            "",
            text,
            "and run:",
            "",
            f"    python -m pytest {filename} -k {info.name}",
            "",
        ]
        if target is not None:
            out += [f"or: kvproto conform {target} --check {info.name.removeprefix('test_')}", ""]
    return "\n".join(out)


def _needs(info: CheckInfo, spec: TierSpec | None, base: type[KitBase]) -> list[str]:
    """What the check needs (each hook with its signature on ``base``), and, for a target, whether
    it has it (KIT-16)."""
    lines: list[str] = []
    caps = None
    if spec is not None:
        try:
            tier = spec.build()
            caps = resolve_capabilities(spec.capabilities, tier)
            problem = spec.not_a_tier(tier)
            shut_down_probe(tier)
        except Exception as exc:
            lines.append(f"(The factory could not build a tier to look at: {one_line(exc)})")
        else:
            if problem is not None:
                lines.append(f"First of all, TIER-1: {problem}; until it has them, no other check runs.")
    for ability in info.unless:
        state = "" if caps is None else (": declared, so the check skips" if caps.has(ability) else ": not declared")
        lines.append(
            f"Vacuous with capability {ability!r}: it checks what not declaring it promises ({info.clause}){state}."
        )
    if not info.needs and not info.hooks:
        every = "" if info.unless else "; it runs against every tier of its kind"
        return [*lines, f"Needs: no capability and no backdoor hook{every}.", ""]
    lines.append("Needs:")
    for ability in info.needs:
        state = ""
        if caps is not None:
            if caps.has(ability):
                state = ": declared"
            else:
                why = caps.reasons.get(ability)
                state = ": NOT declared, so the check skips" + (f" ({why})" if why else "")
        lines.append(f"  capability {ability!r} (Capabilities.{ability}){state}")
    for hook in info.hooks:
        state = ""
        if spec is not None:
            state = ": defined (TierSpec.hooks)" if hook in spec.hooks else ": NOT defined, so the check skips"
        lines.append(f"  backdoor hook {hook}() on the test class{state}")
        if hasattr(base, hook):
            lines.append(f"      def {hook_signature(base, hook).replace('(', '(self, ', 1)}")
    return [*lines, ""]
