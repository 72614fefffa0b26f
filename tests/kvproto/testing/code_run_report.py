"""The reference tiers' code the kit ran, as data: docs/code-run/<tier>.json, written by ``./dev
code-run [TIER ...]`` (tests/kvproto/testing/code_run.py), read here to validate them
(test_code_run_report.py) and to render the KIT-24 section of docs/kit-coverage.md (coverage.py).

A report holds one ``kvproto conform TIER --no-typecheck`` under the default profile: ``tier``,
``command``, ``profile``, ``verdict`` (``conforms``, ``fails`` with ``failed_checks``, ``error``
with ``error``), ``coverage`` (the JSON report's figures: ``packages``, ``left_out``, ``lines``,
``lines_run``, ``share``, ``branches``, ``branches_run``, ``branch_share``, ``modules``,
``not_checked``, ``not_measured``; None when the kit could not run) and ``wall_s``. Issue 40's target:
at least 95% of each reference tier's lines run, or the exception named (:data:`BELOW_TARGET`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CODE_RUN_DIR = ROOT / "docs" / "code-run"
#: The tiers ``./dev code-run`` records, in the order the section lists them: every reference tier
#: ``kvproto conform --list`` marks, then obj over moto's S3 server (code_run.obj_on_s3).
TIERS = (
    "cpu", "fs", "memory", "memory-async", "memory-threaded", "memory-primary", "obj", "obj-s3", "redis",
    "redis-cluster", "mooncake",
)
#: The ``kvproto conform`` target of a tier that is not an installed tier's name.
TARGETS = {"obj-s3": "tests.kvproto.testing.code_run:obj_on_s3"}
VERDICTS = ("conforms", "fails", "error")
#: Issue 40: at least this share of each reference tier's lines run under the default profile.
TARGET_SHARE = 0.95
_FIGURES = ("lines", "lines_run", "branches", "branches_run")

_REDIS = (
    "_local_server (131 lines) is the loopback redis-server the spec starts, partly before the measurement, its stop, "
    "kill, restart and context manager never during it; no check starts an instance that lists the keys (list_blobs): "
    "the spec runs shared mode, whose index is a memo, never a restart scan; hosted_redis_tier is the hosting helper "
    "for engines; the configuration's password-hiding repr and short_error run only on a bad URL or a failed call's "
    "log line; _conforms is read only by mypy"
)
#: Each reference tier whose lines run fall below TARGET_SHARE -> why the default profile does not
#: reach it (issue 40: "or the exception is named in the docs"), read off its not-checked functions.
BELOW_TARGET: dict[str, str] = {
    "cpu": "the data plane runs through the device_copy hook (a CpuTransferHandler over a CPU cache of two layers), "
    "but on CPU tensors: its CUDA copies (_cuda_copy, _cuda_store_chunk, _cuda_load_chunk: tests/impls/cpu/test_cuda.py, "
    "on a GPU), the kernel loader (_streaming_copy: it runs at import, before the kit measures), and the handler's own "
    "completion of the tier (_complete: the hook leaves complete_store/complete_load to the kit) never run; its protocol code is "
    "kvproto's SlotTable, not its own; tensor, pinned, config, block_bytes, slot_view are an engine's accessors, "
    "from_mapping builds it by name, _unpin runs only pinned (the spec runs unpinned), _conforms is read only by mypy",
    "fs": "no check starts an instance whose start-up lists the storage (list_blobs, _subdirs, FileOps.scandir): the "
    "spec runs shared mode, whose index is a memo, never a restart scan; with held HITs on (the default) existence "
    "checks open what they find (open_sizes, KIT-25), so sizes and _stat_size run only with them off; the spec runs "
    "durability='none' (no fsync) and the kit's 64-byte rows never take O_DIRECT (probe_direct, DirectIO.refuse); "
    "hosted_fs_tier is the hosting helper for engines, direct_io_counts introspection, _conforms read only by mypy",
    "memory": "no memory spec runs its non-default configurations: without capacity_blocks its eviction never runs and "
    "without latency_s its worker-thread jobs (_run_later) never do; the refusals of bad constructor options and "
    "malformed jobs and seeds never run (the kit passes good ones); step_driven is read by kvproto simulate --trace, "
    "stored_keys by tests",
    "memory-async": "the same MemoryTier with a capacity that evicts: without latency_s its worker-thread jobs (_run_later) "
    "never run; the refusals of bad constructor options and malformed jobs and seeds never run (the kit passes good "
    "ones); step_driven is read by kvproto simulate --trace, stored_keys by tests",
    "memory-threaded": "the same MemoryTier with worker-thread jobs: without capacity_blocks its eviction never runs; the "
    "refusals of bad constructor options and malformed jobs and seeds never run (the kit passes good ones); "
    "step_driven is read by kvproto simulate --trace, stored_keys by tests",
    "memory-primary": "its protocol code is kvproto's SlotTable, not its own: of its 17 lines, the constructor's refusal "
    "of a bad block_bytes or an unallocatable buffer never runs (the kit passes good options), block_bytes and "
    "slot_view are an engine's data plane, step_driven is read by kvproto simulate --trace",
    "obj": "the spec hands the tier an in-memory store, so _store's make_store, client_options, retry_config and "
    "ObjTierConfig's validators run only against S3 (obj-s3); existence checks go in batches (KIT-25), so "
    "ObstoreBackend.sizes runs only without them, and ListPlanner.estimate and outgrew only for a namespace whose "
    "listing outgrows its page budget (the kit's namespaces hold at most a few hundred blobs); no check starts an "
    "instance that lists the bucket (list_blobs); known_keys, listed_objects, open_existence_batches, "
    "existence_batches, skipped_uploads and OpenBatches.__len__ are introspection, _conforms read only by mypy",
    "obj-s3": "existence checks go in batches (KIT-25), so ObstoreBackend.sizes runs only without them, and "
    "ListPlanner.estimate and outgrew only for a namespace whose listing outgrows its page budget (the kit's "
    "namespaces hold at most a few hundred blobs); no check starts an instance that lists the bucket (list_blobs); "
    "known_keys, listed_objects, open_existence_batches, existence_batches, skipped_uploads and OpenBatches.__len__ "
    "are introspection, _conforms read only by mypy",
    "redis": _REDIS,
    "redis-cluster": _REDIS,
    "mooncake": "_local_server (109 lines) is the loopback Mooncake master and store the spec starts, partly before the "
    "measurement, its stop, kill, restart and log helpers never during it; no check takes the master away, so "
    "MasterGate's outage paths (closed, answers, _close: MC-12) and probe_reachable never run; no check starts an "
    "instance that lists the store (list_blobs, _NoListing); _client._forked runs only in forked children (not measured); "
    "MooncakeOps.get and size are used by tests, not the backend; hosted_mooncake_tier is the hosting helper for "
    "engines, registered_bytes and waiting introspection, short_error a failed call's log line, _conforms read only by mypy",
}


class BadCodeRunReport(ValueError):
    """A docs/code-run/*.json that is not what ``./dev code-run`` writes."""


def _need(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise BadCodeRunReport(f"{where}: no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):  # no field is a bool: True is no count
        raise BadCodeRunReport(f"{where}: {key!r} is {value!r}, not {kind}")
    return value


def _validate_figures(ran: dict[str, Any], where: str) -> None:
    """The figures add up: run <= counted, the shares are run / counted, the modules sum to the whole."""
    for key in ("packages", "left_out", "not_checked"):
        if not all(isinstance(x, str) for x in _need(ran, key, list, where)):
            raise BadCodeRunReport(f"{where}: {key!r} holds a non-string")
    counts = {key: _need(ran, key, int, where) for key in _FIGURES}
    if counts["lines_run"] > counts["lines"] or counts["branches_run"] > counts["branches"]:
        raise BadCodeRunReport(f"{where}: more run than counted: {counts}")
    for share, run, of in (("share", "lines_run", "lines"), ("branch_share", "branches_run", "branches")):
        value = _need(ran, share, (float, int, type(None)), where)
        expected = None if counts[of] == 0 else round(counts[run] / counts[of], 4)
        if value != expected:
            raise BadCodeRunReport(f"{where}: {share} {value!r} is not {run} / {of} ({expected!r})")
    modules = _need(ran, "modules", dict, where)
    for key in _FIGURES:
        total = sum(int(m[key]) for m in modules.values())
        if total != counts[key]:
            raise BadCodeRunReport(f"{where}: the modules' {key} sum to {total}, not {counts[key]}")
    _need(ran, "not_measured", (str, type(None)), where)


def validate(data: Any, where: str) -> dict[str, Any]:
    """``data`` itself, after checking it is what ``./dev code-run`` writes: every field present, a
    known tier and verdict, figures that add up (or None with an error that says why). Raises
    BadCodeRunReport naming what is wrong."""
    if not isinstance(data, dict):
        raise BadCodeRunReport(f"{where}: not a JSON object")
    tier = _need(data, "tier", str, where)
    if tier not in TIERS:
        raise BadCodeRunReport(f"{where}: unknown tier {tier!r}")
    command = _need(data, "command", list, where)
    if command[:3] != ["kvproto", "conform", TARGETS.get(tier, tier)]:
        raise BadCodeRunReport(f"{where}: command {command!r} does not run {tier}")
    if _need(data, "profile", str, where) != "default":
        raise BadCodeRunReport(f"{where}: profile {data['profile']!r}, not the default")
    verdict = _need(data, "verdict", str, where)
    if verdict not in VERDICTS:
        raise BadCodeRunReport(f"{where}: verdict {verdict!r} not one of {VERDICTS}")
    error = _need(data, "error", (str, type(None)), where)
    if (verdict == "error") != (error is not None):
        raise BadCodeRunReport(f"{where}: verdict {verdict!r} with error {error!r}")
    _need(data, "failed_checks", list, where)
    _need(data, "wall_s", (int, float), where)
    ran = _need(data, "coverage", (dict, type(None)), where)
    if ran is None and error is None:
        raise BadCodeRunReport(f"{where}: no figures and no error saying why")
    if ran is not None:
        _validate_figures(ran, where)
    return data


def load_reports() -> list[dict[str, Any]]:
    """The committed reports, validated, in TIERS order."""
    found = []
    for tier in TIERS:
        path = CODE_RUN_DIR / f"{tier}.json"
        if path.is_file():
            found.append(validate(json.loads(path.read_text()), str(path.relative_to(ROOT))))
    return found


def share_of(report: dict[str, Any]) -> float | None:
    """The share of the tier's lines the run ran; None when it has no figures."""
    ran = report["coverage"]
    return None if ran is None else ran["share"]


def below_target(reports: list[dict[str, Any]]) -> list[str]:
    """The tiers under TARGET_SHARE, or with no figures at all (they need an exception as much)."""
    return [r["tier"] for r in reports if (share := share_of(r)) is None or share < TARGET_SHARE]


def _row(report: dict[str, Any]) -> str:
    ran, tier = report["coverage"], report["tier"]
    verdict = "" if report["verdict"] == "conforms" else f" ({report['verdict']})"
    if ran is None or ran["share"] is None:
        why = report["error"] or ran["not_measured"]
        return f"| {tier}{verdict} | - | - | - | - | no: {why} |"
    branches = "-" if ran["branch_share"] is None else (
        f"{ran['branches_run']} of {ran['branches']} ({ran['branch_share']:.1%})")
    reached = "yes" if ran["share"] >= TARGET_SHARE else "no: exception below"
    return (f"| {tier}{verdict} | {ran['lines_run']} of {ran['lines']} | {branches} | {ran['share']:.1%} "
            f"| {len(ran['not_checked'])} | {reached} |")


def _exception(report: dict[str, Any]) -> list[str]:
    ran, tier = report["coverage"], report["tier"]
    lines = ["", f"### Below {TARGET_SHARE:.0%}: {tier}", "", f"Exception: {BELOW_TARGET.get(tier, '**none named**')}."]
    if ran is None:
        return lines
    prefix = ran["packages"][0] + "." if len(ran["packages"]) == 1 else ""
    modules = ", ".join(f"`{m}` {c['lines_run']}/{c['lines']}" for m, c in sorted(ran["modules"].items()))
    never = ", ".join(f"`{f.removeprefix(prefix)}`" for f in ran["not_checked"]) or "none"
    left_out = f" (left out: {', '.join(ran['left_out'])})" if ran["left_out"] else ""
    lines += ["", f"Measured: {', '.join(ran['packages'])}{left_out}; lines run per module: {modules}.", "",
              f"Functions not checked (none of their lines ran): {never}."]
    return lines


def render_section() -> list[str]:
    """The KIT-24 section of docs/kit-coverage.md, from the committed reports."""
    reports = load_reports()
    lines = [
        "## Code of the reference tiers the kit ran (KIT-24)",
        "",
        "`./dev code-run [TIER ...]` runs `kvproto conform TIER --no-typecheck` (default profile, coverage",
        "on) on each reference tier, one at a time, and records its figures in docs/code-run/TIER.json:",
        "the lines and branches inside the tier's own functions that the run ran, and each function none",
        "of whose lines ran (not checked). Code run only in the crash checks' forked children is not",
        f"measured. Issue 40's target: {TARGET_SHARE:.0%} of lines; each tier below it names its exception.",
        "`obj-s3` is the object-store tier over moto's S3 server on loopback; memory, memory-async and",
        "memory-threaded measure the same module, `kvproto._memory_tier`; redis and redis-cluster start",
        "Debian's redis-server on loopback, mooncake its master and store, as their specs do under",
        "`kvproto conform`. A few lines vary between runs (which path a job takes can depend on a race).",
        "",
        f"| tier | lines run | branches run | share | functions not checked | \u2265{TARGET_SHARE:.0%}? |",
        "|---|---|---|---|---|---|",
        *(_row(r) for r in reports),
    ]
    missing = [t for t in TIERS if t not in {r["tier"] for r in reports}]
    if missing:
        lines += ["", f"Not recorded yet: {', '.join(missing)}."]
    below = set(below_target(reports))
    for report in reports:
        if report["tier"] in below:
            lines += _exception(report)
    return lines
