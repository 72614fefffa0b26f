"""``kvproto typecheck``: strict mypy proves a tier class satisfies the protocol it claims (KIT-12).

The check writes a small module that assigns the class to each protocol
member on its own (one single-member Protocol per member) and to the whole
protocol, runs mypy on it through ``mypy.api`` with kvproto's own settings
(embedded: an installed wheel has no mypy.ini), and turns mypy's notes into
plain words: "lookup returns bool | None; the contract requires LookupResult".
Errors mypy finds inside the tier's own module (a ``match`` on LookupResult
missing a member, say) are reported too, for a tier in a source tree (an
installed wheel is checked against the protocol only: mypy reports no errors
inside installed packages).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto.errors import ConfigurationError

__all__ = [
    "MYPY_SETTINGS",
    "PendingTypecheck",
    "TypecheckResult",
    "claimed_protocol",
    "start_typecheck",
    "typecheck_class",
]

MYPY_SETTINGS = """[mypy]
strict = True
warn_unreachable = True
enable_error_code = exhaustive-match, truthy-bool, redundant-expr, ignore-without-code, possibly-undefined
show_error_codes = True
"""
"""kvproto's own mypy configuration (mypy.ini), embedded for installed wheels."""

ProtocolName = Literal["primary", "secondary"]
_PROTOCOLS: dict[ProtocolName, type] = {"primary": PrimaryTier, "secondary": SecondaryTier}


@dataclass
class TypecheckResult:
    """The verdict on one class: ``problems`` in plain words (empty when it conforms)."""

    target: str
    protocol: str
    problems: list[str] = field(default_factory=list)
    module_errors: list[str] = field(default_factory=list)
    #: Why the tier's own module was not checked for strict errors (only the protocol was); None if it was.
    unchecked_module: str | None = None
    mypy_output: str = ""

    @property
    def passed(self) -> bool:
        """True if the class satisfies the protocol and its module type-checks."""
        return not self.problems and not self.module_errors

    def to_json(self) -> dict[str, object]:
        """The verdict as the JSON reports write it."""
        return {
            "protocol": self.protocol,
            "passed": self.passed,
            "problems": self.problems,
            "module_errors": self.module_errors,
            "module_checked": self.unchecked_module is None,
            "unchecked_module": self.unchecked_module,
        }

    def all_problems(self) -> list[str]:
        """Protocol problems first, then errors inside the tier's module."""
        return [*self.problems, *self.module_errors]


def claimed_protocol(cls: type) -> ProtocolName:
    """The protocol ``cls`` claims: one it subclasses, else the shape of its methods."""
    for name, proto in _PROTOCOLS.items():
        if proto in cls.__mro__:
            return name
    if hasattr(cls, "prepare_store") and not hasattr(cls, "submit_store"):
        return "primary"
    return "secondary"


def _members(proto: type) -> list[tuple[str, str]]:
    """(name, stub source) for every member of ``proto``, read from its own signatures."""
    found: list[tuple[str, str]] = []
    for name in sorted(n for n in dir(proto) if not n.startswith("_")):
        value = inspect.getattr_static(proto, name)
        if isinstance(value, property) and value.fget is not None:
            ret = value.fget.__annotations__.get("return", "object")
            found.append((name, f"    @property\n    def {name}(self) -> {ret}: ..."))
        elif inspect.isfunction(value):
            sig = inspect.signature(value)
            params = ", ".join(
                p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {p.annotation}"
                for p in sig.parameters.values()
            )
            ret = sig.return_annotation
            found.append((name, f"    def {name}({params}) -> {ret}: ..."))
    return found


_HEADER = """from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from kvproto import (
    JobResult,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    PrimaryTier,
    ReqContext,
    SecondaryTier,
    TransferJob,
)
import {module} as _target_module

_Target = _target_module.{qualname}
"""


def _snippet(cls: type, proto_name: ProtocolName) -> tuple[str, dict[int, str]]:
    proto = _PROTOCOLS[proto_name]
    text = _HEADER.format(module=cls.__module__, qualname=cls.__qualname__)
    # A generic tier (a wrapper over any tier, say) is checked with Any for its type parameters.
    params = getattr(cls, "__parameters__", ())
    annotation = f"_target_module.{cls.__qualname__}" + (f"[{', '.join(['Any'] * len(params))}]" if params else "")
    lines: dict[int, str] = {}
    parts = [text]
    for name, stub in _members(proto):
        parts.append(
            f"\n\nclass _Member_{name}(Protocol):\n{stub}\n\n\n"
            f"def _check_{name}(tier: {annotation}) -> _Member_{name}:\n    return tier\n"
        )
    parts.append(
        f"\n\ndef _check_whole(tier: {annotation}) -> {proto.__name__}:\n    return tier\n"
    )
    source = "".join(parts)
    for number, line in enumerate(source.splitlines(), start=1):
        found = re.match(r"def _check_(\w+)\(", line)
        if found:
            lines[number + 1] = found.group(1)
    return source, lines


_SIG = re.compile(r"def (?:\[.*?\] )?(\w+)\((.*)\) -> (.+)$")


def _plain(member: str, expected: str | None, got: str | None, raw: list[str]) -> str:
    """One problem in plain words."""
    if expected and got:
        want, have = _SIG.match(expected), _SIG.match(got)
        if want and have:
            want_params = ", ".join(p for p in want.group(2).split(", ") if p != "self")
            have_params = ", ".join(p for p in have.group(2).split(", ") if p != "self")
            if want_params != have_params:
                return f"{member} takes ({have_params}); the contract requires ({want_params})"
            return f"{member} returns {have.group(3)}; the contract requires {want.group(3)}"
        return f"{member} is {got}; the contract requires {expected}"
    text = " ".join(r.strip() for r in raw if r.strip())
    if "missing following" in text or "is missing" in text:
        return f"{member} is missing"
    return f"{member}: {text}" if text else f"{member} does not match the contract"


def _parse(output: str, snippet: Path, lines: dict[int, str], module_file: str | None) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    module_errors: list[str] = []
    current: str | None = None
    notes: list[str] = []

    def flush() -> None:
        nonlocal current, notes
        if current is not None and current != "whole":
            expected = got = None
            for i, note in enumerate(notes):
                if note.strip() == "Expected:" and i + 1 < len(notes):
                    expected = notes[i + 1].strip()
                if note.strip() == "Got:" and i + 1 < len(notes):
                    got = notes[i + 1].strip()
                member_line = re.match(r"\s*(\w+): expected (.+), got (.+)$", note)
                if member_line and expected is None:
                    expected, got = member_line.group(2).strip('"'), member_line.group(3).strip('"')
            problems.append(_plain(current, expected, got, notes))
        current, notes = None, []

    for line in output.splitlines():
        found = re.match(r"^(.*?):(\d+): (error|note): (.*)$", line)
        if not found:
            continue
        path, number, kind, message = found.group(1), int(found.group(2)), found.group(3), found.group(4)
        if Path(path).name == snippet.name:
            if kind == "error":
                flush()
                current = lines.get(number, "whole")
                if current == "whole" and number not in lines:
                    problems.append(f"cannot check the class: {message}")
                    current = None
            elif current is not None:
                notes.append(message)
        elif kind == "error" and module_file is not None and os.path.samefile(path, module_file):
            flush()
            module_errors.append(f"{Path(path).name}:{number}: {message}")
    flush()
    return problems, module_errors


def _mypy_path(*folders: Path) -> str:
    keep = []
    for folder in folders:
        text = str(folder)
        if "site-packages" not in text and "dist-packages" not in text and text not in keep:
            keep.append(text)
    return os.pathsep.join(keep)


def _installed(root: Path) -> bool:
    """Whether ``root`` is an installation directory (site-packages), not a source tree."""
    import site
    import sysconfig

    places = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")} | set(site.getsitepackages())
    places.add(site.getusersitepackages())
    return any(root == Path(p).resolve() for p in places) or root.name in ("site-packages", "dist-packages")


def _root_of(module_file: Path, module_name: str) -> Path:
    root = module_file.parent
    depth = module_name.count(".")
    if module_file.name == "__init__.py":
        depth += 1
    for _ in range(depth):
        root = root.parent
    return root


@dataclass(frozen=True)
class _Copy:
    """An installed package copied for mypy: ``parent_root`` goes on mypy_path, ``module`` is checked."""

    parent_root: Path
    module: Path


def _copy_installed(module_file: Path, root: Path, module_name: str, into: Path) -> _Copy | None:
    """Copy the installed top-level package (or module) holding ``module_name`` from ``root`` into
    ``into`` (a folder kept per install root, so mypy's cache stays warm); None if it cannot."""
    top = module_name.split(".", 1)[0]
    source = root / top if (root / top).is_dir() else root / f"{top}.py"
    try:
        if into.exists():
            shutil.rmtree(into)
        into.mkdir(parents=True)
        if source.is_dir():
            shutil.copytree(source, into / top, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
        else:
            shutil.copy2(source, into / source.name)
        return _Copy(into, into / module_file.relative_to(root))
    except (OSError, ValueError):
        return None


class PendingTypecheck:
    """A type check running in a ``python -m mypy`` subprocess, so it overlaps the kit's run."""

    def __init__(self, cls: type, protocol: ProtocolName | None, label: str | None) -> None:
        self.cls = cls
        self._tmp = tempfile.TemporaryDirectory(prefix="kvproto-typecheck-")
        self.result, self._args, self._snippet, self._lines, self._module_file = _prepare(
            cls, protocol, label, Path(self._tmp.name)
        )
        self._proc: subprocess.Popen[str] | None = None
        if self._args:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "mypy", *self._args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

    def wait(self) -> TypecheckResult:
        """Wait for mypy and return the verdict."""
        try:
            if self._proc is not None:
                stdout, stderr = self._proc.communicate()
                _finish(
                    self.result,
                    self.cls,
                    stdout,
                    stderr,
                    self._proc.returncode,
                    self._snippet,
                    self._lines,
                    self._module_file,
                )
            return self.result
        finally:
            self._tmp.cleanup()


def _prepare(
    cls: type, protocol: ProtocolName | None, label: str | None, folder: Path
) -> tuple[TypecheckResult, list[str], Path, dict[int, str], str | None]:
    chosen = protocol or claimed_protocol(cls)
    if chosen not in _PROTOCOLS:
        raise ConfigurationError(f"unknown protocol {chosen!r}; choose primary or secondary")
    module = sys.modules.get(cls.__module__) or importlib.import_module(cls.__module__)
    module_file: str | None = getattr(module, "__file__", None)
    result = TypecheckResult(label or f"{cls.__module__}:{cls.__qualname__}", _PROTOCOLS[chosen].__name__)
    snippet = folder / "kvproto_typecheck_target.py"
    if "<locals>" in cls.__qualname__ or module_file is None:
        result.problems.append(
            f"{cls.__qualname__} is not importable by name from a module file; mypy cannot see it"
        )
        return result, [], snippet, {}, None
    import kvproto

    kvproto_root = Path(kvproto.__file__).resolve().parent.parent
    target_root = _root_of(Path(module_file).resolve(), cls.__module__)
    # One mypy cache per project root: mypy caches a module's errors with its path, so a cache shared
    # by two copies of one module (a moved checkout, two temporary directories) reports the other's path.
    root_id = hashlib.sha1(str(target_root).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvproto" / "mypy" / root_id
    source, lines = _snippet(cls, chosen)
    snippet.write_text(source)
    config = folder / "mypy.ini"
    config.write_text(MYPY_SETTINGS + f"mypy_path = {_mypy_path(kvproto_root, target_root)}\n")
    args = [
        "--config-file", str(config),
        "--cache-dir", str(cache),
        "--python-executable", sys.executable,
        "--no-error-summary",
        "--show-absolute-path",
        "--hide-error-context",
        "--no-pretty",
        str(snippet),
    ]
    if _installed(target_root):
        # An installed (non-editable) package: mypy reports no errors inside site-packages, and
        # naming a file there makes it treat all of site-packages as the user's own code. So the
        # tier's top-level package is copied to a folder of its own, first on mypy_path (it shadows
        # the installed copy), and the copy of the tier's module is checked (KIT-12).
        copied = _copy_installed(Path(module_file).resolve(), target_root, cls.__module__, cache.parent / f"{root_id}-src")
        if copied is None:
            result.unchecked_module = (
                f"{cls.__module__} is installed and could not be copied for mypy: its own strict errors were "
                "not checked (only the protocol was)"
            )
            return result, args, snippet, lines, None
        config.write_text(MYPY_SETTINGS + f"mypy_path = {_mypy_path(copied.parent_root, kvproto_root)}\n")
        return result, [*args, str(copied.module)], snippet, lines, str(copied.module)
    return result, [*args, module_file], snippet, lines, module_file


def _finish(
    result: TypecheckResult,
    cls: type,
    stdout: str,
    stderr: str,
    code: int,
    snippet: Path,
    lines: dict[int, str],
    module_file: str | None,
) -> None:
    result.mypy_output = stdout + stderr
    problems, result.module_errors = _parse(stdout, snippet, lines, module_file)
    result.problems = [
        f"{p.split(' ', 1)[0]} is missing"
        if p.endswith(" does not match the contract") and not hasattr(cls, p.split(" ", 1)[0])
        else p
        for p in problems
    ]
    if code not in (0, 1) and not result.problems and not result.module_errors:
        tail = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1]
        result.problems.append(f"mypy could not run: {tail}")


def start_typecheck(
    cls: type, *, protocol: ProtocolName | None = None, label: str | None = None
) -> PendingTypecheck:
    """Start :func:`typecheck_class` in the background; ``.wait()`` gives the result."""
    return PendingTypecheck(cls, protocol, label)


def typecheck_class(
    cls: type, *, protocol: ProtocolName | None = None, label: str | None = None
) -> TypecheckResult:
    """Run strict mypy (through ``mypy.api``) on ``cls`` against ``protocol``
    (default: :func:`claimed_protocol`) (KIT-12)."""
    from mypy import api

    with tempfile.TemporaryDirectory(prefix="kvproto-typecheck-") as tmp:
        result, args, snippet, lines, module_file = _prepare(cls, protocol, label, Path(tmp))
        if not args:
            return result
        stdout, stderr, code = api.run(args)
        _finish(result, cls, stdout, stderr, code, snippet, lines, module_file)
    return result
