"""``./dev mutate TIER [--sample N] [--seed S]``: mutation testing of a reference tier with the kit as
the test command (issue 17, section 5). Writes docs/mutation/TIER.json (mutation_report.py says what
it holds); ``python -m tests.kvproto.testing.coverage`` then renders it into docs/kit-coverage.md.

cosmic-ray's operators (its ``core`` provider, the ones that take no arguments) make the mutants:
each mutant is written into a copy of its package in a temporary folder, put first on the
``PYTHONPATH`` of a child process running ``kvproto conform`` (ahead of the editable installs), so the
checkout is never written: a commit made during a run cannot take a mutant in. Mutants inside type
annotations and ``if TYPE_CHECKING:`` blocks are left out: they never run. ``--sample N`` draws N
source locations (seeded) and one mutant at each.

Killed: the verdict is not "conforms" (a failed check; the kit could not run; no verdict within the
per-mutant timeout). A rerun keeps the classification of each survivor whose id and changed line
are unchanged, so classifying is done once, by hand, in the JSON. ``--survivors`` reruns only the
committed report's survivors (after a kit change, or with more ``kvproto conform`` targets);
``--timeouts`` reruns the mutants a timeout killed, with a longer ``--timeout`` (a loaded machine can
time out a mutant that would conform, which would count it killed wrongly); ``--operator NAME`` reruns
one operator's mutants (after a change to how the tool applies it). A rerun finds each mutant by its
diff (its operator and changed line), so code added above it since does not lose it.

ExceptionReplacer's mutants name ``CosmicRayTestingException`` in an except clause: every process of a
kit run has it as a builtin (a ``sitecustomize`` on its path), so the mutant is a handler that no longer
catches, as cosmic-ray means it. Before 2026-12-06 it was undefined there, and a mutant whose handler
was reached died of a NameError (counted killed): the reports were rerun with ``--operator``.

Not part of ``./dev test``: one kit run per mutant takes seconds to minutes.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import cosmic_ray.plugins  # type: ignore[import-untyped]  # cosmic-ray ships no type information
from cosmic_ray.ast import ast_nodes, get_ast  # type: ignore[import-untyped]  # as above
from cosmic_ray.mutating import mutate_code  # type: ignore[import-untyped]  # as above

from tests.kvproto.testing.mutation_report import MUTATION_DIR, ROOT, TIERS, validate


@dataclass(frozen=True)
class Target:
    """A tier to mutate: its own source files and the ``kvproto conform`` targets that check it."""

    files: tuple[str, ...]
    conform: tuple[str, ...]


_SPECS = "tests.kvproto.testing.mutation_specs"
_FS = "impls/fs/src/kvproto_fs"
_OBJ = "impls/obj/src/kvproto_obj"
TARGETS: dict[str, Target] = {
    # MemoryTier's three reference configurations: immediate, a capacity that evicts, worker-thread latency.
    "memory": Target(("kvproto/_memory_tier.py",), ("memory", "memory-async", "memory-threaded")),
    "memory-primary": Target(
        (
            "kvproto/_memory_primary_tier.py", "kvproto/tierkit/_slots.py", "kvproto/tierkit/_slot_checks.py",
            "kvproto/_key_batches.py",
        ),
        # The reference spec, and the same tier with a pending deadline on a clock the kit moves (the
        # advance_clock hook: TIER-25), the fully hooked spec the honest-tier tests run.
        ("memory-primary", "tests.kvproto.testing.honest_tiers:clocked_primary"),
    ),
    "blobtier": Target(
        tuple(
            f"kvproto/tierkit/{name}.py"
            for name in ("_blob_tier", "_blob_ops", "_blob_ledger", "_blob_jobs", "_blob_scan", "_blob_config", "_memory_backend")
        ),
        (
            f"{_SPECS}:blob_private", f"{_SPECS}:blob_shared", f"{_SPECS}:blob_async", f"{_SPECS}:blob_loop",
            f"{_SPECS}:blob_held",  # held HITs (TIERKIT-6): the only in-memory spec whose backend offers HeldReads
            f"{_SPECS}:blob_loop_bytes",  # jobs on the loop through read_bytes (the one-pass check), I/O faults too
        ),
    ),
    # FsTier's shared mode (its entry point), its private mode (the restart scan: tests/impls/fs), and
    # 4 KiB page-aligned rows (its O_DIRECT path, which the kit's 64-byte rows never take).
    "fs": Target(
        tuple(f"{_FS}/{name}.py" for name in ("_tier", "_backend", "_io", "_config")),
        ("fs", f"{_SPECS}:fs_private", f"{_SPECS}:fs_direct"),
    ),
    # ObjTier over the in-memory store (the reference spec), with every existence check a HEAD (the largest
    # list_page_cost), and over moto's S3 server on loopback (an endpoint and a region, as production's).
    "obj": Target(
        tuple(f"{_OBJ}/{name}.py" for name in ("_tier", "_backend", "_listing", "_store", "_config", "_stats", "_ops")),
        ("obj", f"{_SPECS}:obj_heads_only", "tests.kvproto.testing.code_run:obj_on_s3"),
    ),
}
assert tuple(TARGETS) == TIERS


@dataclass(frozen=True)
class Mutant:
    file: str
    operator: str
    occurrence: int
    line: int
    col: int

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}:{self.col}:{self.operator}#{self.occurrence}"


def _operators() -> list[tuple[str, Any]]:
    """cosmic-ray's core operators that take no arguments, by name, instantiated."""
    found = []
    for name in cosmic_ray.plugins.operator_names():
        if not name.startswith("core/"):
            continue
        cls = cosmic_ray.plugins.get_operator(name)
        if not cls.arguments():
            found.append((name, cls()))
    return found


def _never_run(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) spans of the code that never runs: annotations (PEP 563: ``from __future__ import
    annotations`` everywhere here) and ``if TYPE_CHECKING:`` bodies."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        parts: list[ast.expr | ast.stmt | None] = []
        if isinstance(node, ast.arg):
            parts.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            parts.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            parts.append(node)
        for part in parts:
            if part is not None and part.end_lineno is not None and part.end_col_offset is not None:
                spans.append(((part.lineno, part.col_offset), (part.end_lineno, part.end_col_offset)))
    return spans


def enumerate_mutants(target: Target) -> tuple[list[Mutant], int]:
    """Every mutant of the target's files (cosmic-ray's enumeration: operator by operator, in tree
    order), less those in code that never runs; and how many were left out so."""
    mutants: list[Mutant] = []
    left_out = 0
    operators = _operators()
    for file in target.files:
        source = (ROOT / file).read_text()
        tree = get_ast(source)
        spans = _never_run(source)
        for name, operator in operators:
            positions = (pos for node in ast_nodes(tree) for pos in operator.mutation_positions(node))
            for occurrence, (start, _end) in enumerate(positions):
                if any(a <= tuple(start) < b for a, b in spans):
                    left_out += 1
                    continue
                mutants.append(Mutant(file, name, occurrence, start[0], start[1]))
    return mutants, left_out


def sample(mutants: list[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """``n`` source locations drawn with ``seed``, one mutant at each (all mutants when ``n`` is None)."""
    if n is None:
        return list(mutants)
    rng = random.Random(seed)
    sites: dict[tuple[str, int, int], list[Mutant]] = {}
    for m in mutants:
        sites.setdefault((m.file, m.line, m.col), []).append(m)
    chosen = rng.sample(sorted(sites), min(n, len(sites)))
    return sorted((rng.choice(sites[site]) for site in chosen), key=lambda m: (m.file, m.line, m.col, m.operator))


def _diff(file: str, before: str, after: str) -> tuple[str, str]:
    """A unified diff and a one-line ``old -> new`` of the changed lines."""
    lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), f"a/{file}", f"b/{file}", n=1, lineterm=""))
    old = " / ".join(x[1:].strip() for x in lines[2:] if x.startswith("-"))
    new = " / ".join(x[1:].strip() for x in lines[2:] if x.startswith("+"))
    return "\n".join(lines), f"{old} -> {new}" if new else f"{old} -> (removed)"


_DEFINE_TESTING_EXCEPTION = (
    "import builtins\n"
    "from cosmic_ray.exceptions import CosmicRayTestingException\n"
    "builtins.CosmicRayTestingException = CosmicRayTestingException\n"
)


def run_kit(target: Target, profile: str, timeout_s: float, *, overlay: Path | None = None) -> dict[str, Any]:
    """``kvproto conform`` on the target in a child process: its verdict, the failed checks, its time.
    ``overlay``: a folder whose packages take the place of the installed ones (a mutant's)."""
    with tempfile.TemporaryDirectory(prefix="kvproto-mutate-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "kvproto", "conform", *target.conform, "--no-typecheck", "--profile", profile]
        # ExceptionReplacer's mutants name CosmicRayTestingException in an except clause: defined here as a
        # builtin in every Python process of the run (the kit's children too), so the mutant means what
        # cosmic-ray means, a handler that no longer catches, not a NameError once an exception reaches it.
        (Path(tmp) / "sitecustomize.py").write_text(_DEFINE_TESTING_EXCEPTION)
        path = (tmp, *(() if overlay is None else (str(overlay),)), str(ROOT))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONDONTWRITEBYTECODE="1", COLUMNS="200")
        started = time.monotonic()
        child = subprocess.Popen(
            [*cmd, "--json", str(report)], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return {"passed": False, "killed_by": "timeout", "failed_checks": [], "seconds": round(time.monotonic() - started, 1)}
        seconds = round(time.monotonic() - started, 1)
        data = json.loads(report.read_text()) if report.is_file() else None
    if data is None or any(t.get("error") for t in data["tiers"]):
        tail = out.decode(errors="replace").strip().splitlines()[-3:]
        return {"passed": False, "killed_by": "error", "failed_checks": [], "seconds": seconds, "error": " | ".join(tail)}
    failed = sorted(
        {f"{t['tier']}:{c['check'].removeprefix('test_')}" for t in data["tiers"] for c in t["checks"]
         if c["outcome"] not in ("passed", "skipped", "xfailed", "xpassed")}
    )
    passed = child.returncode == 0 and bool(data["passed"])
    return {"passed": passed, "killed_by": None if passed else "verdict", "failed_checks": failed, "seconds": seconds}


def _previous(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _from_id(mutant_id: str) -> Mutant:
    """The mutant an id names (``file:line:col:operator#occurrence``)."""
    file, line, col, rest = mutant_id.split(":", 3)
    operator, occurrence = rest.rsplit("#", 1)
    return Mutant(file, operator, int(occurrence), int(line), int(col))


def _located(wanted: list[dict[str, Any]], target: Target) -> list[Mutant]:
    """The current mutant of each report entry in ``wanted``: the one of the same file and operator
    whose diff, its context lines included, is the entry's (else whose changed line is; the nearest
    to its old line where several are), so a line added above a survivor since the report was written
    does not lose it; its old id where none matches."""
    found: list[Mutant] = []
    current, _ = enumerate_mutants(target)
    sources = {file: (ROOT / file).read_text() for file in target.files}
    changes: dict[tuple[str, str], list[tuple[tuple[str, str], Mutant]]] = {}
    for entry in wanted:
        old = _from_id(entry["id"])
        key = (old.file, old.operator)
        if key not in changes:
            operator = cosmic_ray.plugins.get_operator(old.operator)()
            listed: list[tuple[tuple[str, str], Mutant]] = []
            for m in current:
                if (m.file, m.operator) == key:
                    after = mutate_code(sources[m.file], operator, m.occurrence)
                    if after is not None and after != sources[m.file]:
                        diff, change = _diff(m.file, sources[m.file], after)
                        listed.append(((_body(diff), change), m))
            changes[key] = listed
        same = [m for (body, _), m in changes[key] if body == _body(str(entry.get("diff", "")))]
        same = same or [m for (_, change), m in changes[key] if change == entry.get("change")]
        found.append(min(same, key=lambda m: abs(m.line - old.line)) if same else old)
    return found


def _body(diff: str) -> str:
    """A unified diff's changed and context lines, without its file and hunk headers (which hold line numbers)."""
    return "\n".join(line for line in diff.splitlines()[2:] if not line.startswith("@@"))


def _package_of(file: str) -> tuple[Path, str]:
    """The source folder and top-level package holding ``file`` (``kvproto/tierkit/_x.py``: ROOT and
    ``kvproto``; ``impls/fs/src/kvproto_fs/_io.py``: ROOT/impls/fs/src and ``kvproto_fs``)."""
    parts = Path(file).parts
    for i in range(1, len(parts)):
        if (ROOT.joinpath(*parts[:i]) / "__init__.py").is_file():
            return ROOT.joinpath(*parts[: i - 1]), parts[i - 1]
    raise SystemExit(f"{file} is in no package")


def _run_mutants(
    chosen: list[Mutant], target: Target, profile: str, timeout_s: float, previous: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each mutant written into a copy of its package, first on the kit's ``PYTHONPATH``, and the kit run
    on it: the checkout itself is never written (a commit made meanwhile cannot take a mutant in)."""
    results: list[dict[str, Any]] = []
    originals = {file: (ROOT / file).read_text() for file in target.files}
    for i, m in enumerate(chosen, 1):
        operator = cosmic_ray.plugins.get_operator(m.operator)()
        before = originals[m.file]
        after = mutate_code(before, operator, m.occurrence)
        if after is None or after == before:
            continue
        entry: dict[str, Any] = {"id": m.id, "file": m.file, "line": m.line, "col": m.col, "operator": m.operator}
        entry["diff"], entry["change"] = _diff(m.file, before, after)
        try:
            compile(after, m.file, "exec")
        except SyntaxError:
            entry.update(outcome="incompetent", killed_by=None, failed_checks=[], seconds=0.0)
        else:
            source, package = _package_of(m.file)
            with tempfile.TemporaryDirectory(prefix="kvproto-mutant-") as overlay:
                shutil.copytree(source / package, Path(overlay) / package,
                                ignore=shutil.ignore_patterns("__pycache__", "*.so"))
                for built in (source / package).rglob("*.so"):  # compiled extensions, linked as they are
                    (Path(overlay) / built.relative_to(source)).symlink_to(built)
                (Path(overlay) / Path(m.file).relative_to(source.relative_to(ROOT))).write_text(after)
                verdict = run_kit(target, profile, timeout_s, overlay=Path(overlay))
            entry["outcome"] = "survived" if verdict["passed"] else "killed"
            entry.update((k, v) for k, v in verdict.items() if k != "passed")
        old = previous.get(m.id)
        if entry["outcome"] == "survived":
            # The changed line, not the diff: a line added above shifts the diff's hunk header only.
            same = old is not None and old.get("change") == entry["change"]
            entry["classification"] = old.get("classification") if same and old is not None else None
        results.append(entry)
        how = f"{entry['outcome']}" + (f" ({entry['killed_by']})" if entry.get("killed_by") else "")
        shown = f"{how:<20} {entry['seconds']:>6} s  {m.id}  {entry['change'][:90]}"
        print(f"[{i}/{len(chosen)}] {shown}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev mutate", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("tier", choices=TIERS)
    parser.add_argument("--sample", type=int, metavar="N", help="mutate N sampled source locations (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--profile", choices=("fast", "default", "thorough"), default="fast",
                        help="the kit's profile (default fast: one kit run per mutant)")
    parser.add_argument("--timeout", type=float, metavar="S", help="per-mutant timeout (default: 3 x the unmutated run + 45 s)")
    parser.add_argument("--survivors", action="store_true",
                        help="rerun only the survivors of the committed report (after a kit change), keep the rest")
    parser.add_argument("--timeouts", action="store_true",
                        help="rerun only the committed report's mutants killed by a timeout (give a longer --timeout)")
    parser.add_argument("--operator", metavar="NAME",
                        help="rerun only the committed report's mutants of this cosmic-ray operator (after a change "
                             "to how the tool applies it), keep the rest")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--out", type=Path, help="where to write the report (default docs/mutation/TIER.json)")
    args = parser.parse_args(argv)
    target = TARGETS[args.tier]
    out_path = args.out or MUTATION_DIR / f"{args.tier}.json"
    previous = _previous(out_path)
    mutants, left_out = enumerate_mutants(target)
    rerun_only = args.survivors or args.timeouts or args.operator is not None
    if rerun_only:
        if not previous:
            print(f"--survivors/--timeouts: no report at {out_path}", file=sys.stderr)
            return 2
        wanted = [
            m for m in previous["mutants"]
            if (args.survivors and m["outcome"] == "survived") or (args.timeouts and m.get("killed_by") == "timeout")
            or m["operator"] == args.operator
        ]
        chosen = _located(wanted, target)
        moved: dict[str, str] = {m["id"]: c.id for m, c in zip(wanted, chosen, strict=True) if m["id"] != c.id}
    else:
        chosen = sample(mutants, args.sample, args.seed)
        moved = {}  # a fresh sample: every id is current
    if args.list:
        for m in chosen:
            print(m.id)
        print(f"{len(mutants)} mutants ({left_out} in annotations left out), {len(chosen)} chosen", file=sys.stderr)
        return 0
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *target.files], cwd=ROOT, capture_output=True, text=True)
    if dirty.stdout.strip():
        print(f"refusing to mutate files with uncommitted changes:\n{dirty.stdout}", file=sys.stderr)
        return 2
    started = time.monotonic()
    baseline = run_kit(target, args.profile, timeout_s=1800)
    if not baseline["passed"]:
        print(f"the unmutated tier does not conform, nothing to measure: {baseline}", file=sys.stderr)
        return 2
    timeout_s = args.timeout or 3 * baseline["seconds"] + 45
    print(f"{args.tier}: {len(mutants)} mutants, {len(chosen)} to run; unmutated kit run {baseline['seconds']} s, "
          f"timeout {timeout_s:.0f} s", flush=True)
    by_id = {moved.get(m["id"], m["id"]): m for m in previous.get("mutants", [])}
    results = _run_mutants(chosen, target, args.profile, timeout_s, by_id)
    command = ["kvproto", "conform", *target.conform, "--no-typecheck", "--profile", args.profile]
    wall_s = round(time.monotonic() - started, 1)
    if rerun_only:
        rerun = {r["id"]: r for r in results}
        data = dict(previous)
        data["mutants"] = [rerun.get(moved.get(m["id"], m["id"]), m) for m in previous["mutants"]]
        data["test_command"] = command
        data["wall_s"] = round(previous["wall_s"] + wall_s, 1)
        data["reruns"] = [
            *previous.get("reruns", []),
            {"rerun": "survivors" if args.survivors else "timeouts" if args.timeouts else f"operator {args.operator}",
             "mutants": len(chosen),
             "killed": sum(r["outcome"] == "killed" for r in results), "test_command": command,
             "timeout_s": round(timeout_s, 1), "wall_s": wall_s},
        ]
    else:
        data = {
            "tier": args.tier,
            "tool": f"cosmic-ray {version('cosmic-ray')} (core operators without arguments)",
            "test_command": command,
            "profile": args.profile,
            "files": list(target.files),
            "generated": len(mutants),
            "left_out_never_run": left_out,
            "sample": args.sample,
            "seed": args.seed,
            "baseline_s": baseline["seconds"],
            "timeout_s": round(timeout_s, 1),
            "wall_s": wall_s,
            "mutants": results,
        }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(data, indent=1) + "\n")
    s = validate(data, str(out_path))
    print(f"{args.tier}: generated {s.generated}, run {s.run}, killed {s.killed}, survived {s.run - s.killed - s.incompetent} "
          f"({s.unclassified} unclassified), incompetent {s.incompetent}; wall {s.wall_s / 60:.1f} min; wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
