"""``kvproto simulate``: drive an engine-like loop over a stack of tiers and check it survives (MGR-16).

The stack is a primary tier (``--primary``, default ``memory-primary``) and
secondary tiers (``--secondary``, repeatable, default ``memory`` and
``memory-async``), each an installed tier name (``kvproto conform --list``) or
``pkg.module:factory``, with options after a colon (``--secondary
fs:root=/mnt/nvme,capacity_bytes=200GiB``: keyword arguments of the tier's
factory; a secondary not sized on the command line gets 4, 16, 64... times the
primary's slots, top to bottom). Each step takes ``--step-ms`` (default 20 ms,
a decode forward pass of an 8B model on one GPU) so that tiers working on wall
clock time get the time an engine gives them; ``--step-ms 0`` runs CPU-bound.
Requests with shared and multi-turn prefixes run the
prefix and sliding-window scans through a TieringManager; every loaded block is
compared with the bytes stored for its key. ``--faults`` injects faults from
``kvproto.testing.faults`` into every secondary. Exit code 0 when clean; 1 on a
wrong byte, a stuck request, a pin left after shutdown or an exception escaping
the manager (and, with ``--strict``, on a failing tier: one that lost, failed or
timed out, more than ``--max-lost-jobs`` of its jobs, or never worked; or on a
useless one: one that stored nothing, served nothing or timed out most of its
jobs); 2 on a usage error; 130 when Ctrl-C ended the run (its report is still
written, marked interrupted). What tiers log while the run goes is counted per
tier, not printed (MGR-21).
``--metrics-port`` serves the run's per-tier metrics (``kvproto.metrics``) on
127.0.0.1, ``--metrics`` writes their final exposition text and ``--report``
a self-contained HTML page of the run. ``--trace FILE`` replays a recorded
workload (the Mooncake trace format) instead of generating one
(:mod:`kvproto._cli.simulate_trace`, MGR-22; docs/simulate.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from kvproto._cli.simulate_trace import TracePlan
    from kvproto._protocols import PrimaryTier, SecondaryTier
    from kvproto._simulation import FaultPlan, SimConfig, SimReport
    from kvproto.metrics import KvMetrics
    from kvproto.testing._harness.tier_spec import TierSpec

__all__ = ["add_arguments", "run"]

DEFAULT_PRIMARY = "memory-primary"
DEFAULT_SECONDARIES = ("memory", "memory-async")
DEFAULT_STEPS = 1000
#: The default step: 20 ms, about one decode forward pass of an 8B model at a moderate batch on one GPU.
DEFAULT_STEP_MS = 20.0


class UsageError(Exception):
    """A command line that cannot run: its message is printed on one line, exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    parser.add_argument(
        "--primary", metavar="NAME", default=DEFAULT_PRIMARY,
        help="the primary tier: an installed tier name or pkg.module:factory, options after a colon "
        f"(NAME:opt=value,...) (default {DEFAULT_PRIMARY})",
    )
    parser.add_argument(
        "--secondary", metavar="NAME[:OPT=VALUE,...]", action="append", default=None,
        help="a secondary tier, in lookup order; repeatable (default: "
        + " and ".join(DEFAULT_SECONDARIES) + "). Options are keyword arguments of the tier's factory, e.g. "
        "fs:root=/mnt/nvme,capacity_bytes=200GiB or memory:capacity_blocks=4096 (sizes take B, KB, MB, GB, "
        "KiB, MiB, GiB); a tier not sized here gets 4, 16, 64... times the primary's slots, top to bottom",
    )
    parser.add_argument(
        "--faults", metavar="SPEC", default=None,
        help="faults injected into every secondary: fail=P,corrupt=P,latency=N,raise=P,brownout=S (any subset); "
        "fail: the next job fails (probability per step), corrupt: a promotion's read is damaged and "
        "detected (per promotion), latency: N more steps per job and per first lookup, "
        "raise: one method raises once (per step), brownout: the tiers stop answering jobs for S seconds "
        "once every 4S",
    )
    parser.add_argument("--steps", type=int, metavar="N", help=f"run N steps (default {DEFAULT_STEPS} "
                        "unless --seconds is given)")
    parser.add_argument("--seconds", type=float, metavar="S", help="run for S seconds (with --steps: "
                        "whichever comes first)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the workload and the "
                        "faults; a stack driven by steps alone runs the same for the same seed (default 0)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--window", type=int, default=2, metavar="BLOCKS",
                        help="the sliding window of the requests that use the window scan (default 2)")
    parser.add_argument("--max-live", type=int, metavar="N",
                        help="live requests at most (default: from the primary's slot count)")
    parser.add_argument("--max-prompt-blocks", type=int, metavar="N",
                        help="blocks per prompt at most (default: from the primary's slot count)")
    parser.add_argument("--stuck-steps", type=int, default=64, metavar="N",
                        help="a request deferred more than N steps and --stuck-seconds is stuck (default 64)")
    parser.add_argument("--stuck-seconds", type=float, default=1.0, metavar="S",
                        help="see --stuck-steps (default 1.0; both bounds must pass, so a tier whose jobs "
                        "take wall-clock time is not called stuck for a fast loop)")
    parser.add_argument("--step-ms", type=float, default=DEFAULT_STEP_MS, metavar="MS",
                        help="sleep MS milliseconds after each step, as an engine's forward pass takes "
                        f"(default {DEFAULT_STEP_MS:g}: a decode step of an 8B model on one GPU; 0 runs CPU-bound; "
                        "excluded from lookups per second)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 on warnings too: a failing tier (lost more than --max-lost-jobs of its jobs, "
                        "or never worked) or a useless one (stored nothing, served nothing, or timed out most of "
                        "its jobs)")
    parser.add_argument("--max-lost-jobs", type=float, default=0.05, metavar="SHARE",
                        help="the share of a secondary's jobs that may fail or time out (those the run's --faults "
                        "caused aside) before the run is not clean (default 0.05; --strict exits 1 past it)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve the run's Prometheus metrics at http://127.0.0.1:PORT/metrics while it runs "
                        "(0: any free port, printed; needs kvproto[metrics])")
    parser.add_argument("--metrics", type=Path, metavar="FILE",
                        help="write the final Prometheus exposition text to FILE (needs kvproto[metrics])")
    parser.add_argument("--report", type=Path, metavar="HTML",
                        help="write a self-contained HTML page of the run (plots and the table's figures)")
    from kvproto._cli.simulate_trace import add_trace_arguments

    add_trace_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import warnings

    from rich.console import Console

    # torch (the cpu tier) probes for numpy when it is imported; kvproto does not use numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    console = Console()
    from kvproto._cli.simulate_trace import plan_trace

    try:
        faults, config_kwargs = _parse(args)
        trace = plan_trace(args)  # --trace (MGR-22): checked before any tier is built
        if trace is not None:
            config_kwargs = trace.config_kwargs(config_kwargs, args)
        metrics = _metrics(args)
        primary_arg = args.primary if trace is None else trace.primary_arg(args.primary)
        primary, secondaries, options = _build(primary_arg, args.secondary or list(DEFAULT_SECONDARIES))
    except UsageError as exc:
        console.print(f"kvproto simulate: {exc}", style="red", markup=False, emoji=False, highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:  # while the tiers were being built: nothing ran, nothing to report
        console.print("kvproto simulate: interrupted before the run began; no report", style="yellow",
                      markup=False, emoji=False, highlight=False, soft_wrap=True)
        return 130
    return _simulate(console, args, (primary, secondaries, options), faults, config_kwargs, metrics, trace)


def _metrics(args: argparse.Namespace) -> KvMetrics:
    """The run's KvMetrics; a usage error when Prometheus output is asked for without prometheus_client."""
    from kvproto.metrics import KvMetrics, MetricsUnavailable

    metrics = KvMetrics()
    port: int | None = args.metrics_port
    if port is not None and not 0 <= port <= 65535:
        raise UsageError(f"--metrics-port must be a port number 0..65535, got {port}")
    if port is not None or args.metrics is not None:
        try:
            metrics.exposition()
        except MetricsUnavailable as exc:
            option = "--metrics-port" if port is not None else "--metrics"
            raise UsageError(f"{option}: {exc}") from None
    return metrics


def _parse(args: argparse.Namespace) -> tuple[FaultPlan, dict[str, object]]:
    import math

    from kvproto._simulation import FaultPlan, FaultSpecError, parse_faults

    faults = FaultPlan()
    if args.faults is not None:
        try:
            faults = parse_faults(args.faults)
        except FaultSpecError as exc:
            raise UsageError(str(exc)) from None
    steps: int | None = args.steps
    seconds: float | None = args.seconds
    if steps is None and seconds is None:
        steps = DEFAULT_STEPS
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be >= 1, got {steps}")
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"--seconds must be a number > 0, got {seconds}")
    for option, value in (("--window", args.window), ("--max-live", args.max_live),
                          ("--max-prompt-blocks", args.max_prompt_blocks), ("--stuck-steps", args.stuck_steps)):
        if value is not None and value < 1:
            raise UsageError(f"{option} must be >= 1, got {value}")
    for option, number in (("--stuck-seconds", args.stuck_seconds), ("--step-ms", args.step_ms)):
        if not (math.isfinite(number) and number >= 0):
            raise UsageError(f"{option} must be a number >= 0, got {number}")
    if not (math.isfinite(args.max_lost_jobs) and 0 <= args.max_lost_jobs <= 1):
        raise UsageError(f"--max-lost-jobs must be a share 0..1, got {args.max_lost_jobs}")
    return faults, {
        "steps": steps,
        "seconds": seconds,
        "seed": args.seed,
        "faults": faults,
        "window": args.window,
        "max_live_requests": args.max_live,
        "max_prompt_blocks": args.max_prompt_blocks,
        "stuck_steps": args.stuck_steps,
        "stuck_seconds": args.stuck_seconds,
        "step_sleep_s": args.step_ms / 1000.0,
        "max_failure_share": args.max_lost_jobs,
    }


def _build(
    primary_arg: str, secondary_args: list[str]
) -> tuple[PrimaryTier, list[SecondaryTier], dict[str, dict[str, object]]]:
    """Resolve and build the stack: the primary from its spec, each secondary over its buffer, with their options.

    Returns the tiers and the options each was built with, by its argument's name.
    """
    parsed = _parsed(primary_arg, secondary_args)
    specs = _specs(parsed)
    options = [opts for _, _, opts in parsed]
    primary, secondaries = _built(specs, options)
    return primary, secondaries, {name: opts for (_, name, _), opts in zip(parsed, options, strict=True)}


def _parsed(primary_arg: str, secondary_args: list[str]) -> list[tuple[str, str, dict[str, object]]]:
    """``(option, tier name, its options)`` of ``--primary`` then each ``--secondary``."""
    from kvproto._simulation import TierOptionError, parse_tier_arg

    parsed: list[tuple[str, str, dict[str, object]]] = []
    for option, arg in (("--primary", primary_arg), *(("--secondary", a) for a in secondary_args)):
        try:
            name, given = parse_tier_arg(arg)
        except TierOptionError as exc:
            raise UsageError(f"{option} {exc}") from None
        parsed.append((option, name, dict(given)))
    return parsed


def _specs(parsed: list[tuple[str, str, dict[str, object]]]) -> list[tuple[str, str, TierSpec]]:
    """``(option, name, TierSpec)`` of each tier, the first a primary, the others secondaries; a
    secondary named twice, or a tier that cannot be resolved or is of the other kind, is a usage error."""
    try:
        from kvproto._cli.targets import resolve_target
    except ModuleNotFoundError as exc:  # targets loads the kit, which runs on pytest
        raise UsageError(
            f"resolving tiers needs {exc.name}, which is not installed: pip install 'kvproto[kit]'"
        ) from None
    from kvproto.errors import KvprotoError

    seen: set[str] = set()
    for _, name, _ in parsed[1:]:
        if name in seen:
            raise UsageError(f"--secondary {name} is given twice; each tier of a stack needs its own name")
        seen.add(name)
    specs: list[tuple[str, str, TierSpec]] = []
    for index, (option, name, _) in enumerate(parsed):
        kind = "primary" if index == 0 else "secondary"
        try:
            spec = resolve_target(name)
        except KvprotoError as exc:
            text = str(exc)
            said = text.startswith((name, repr(name)))  # resolve_target's messages start with the target
            raise UsageError(f"{option} {text}" if said else f"{option} {name}: {text}") from None
        except Exception as exc:  # a factory's module failing to import, say: still a usage error
            raise UsageError(f"{option} {name}: cannot load it: {type(exc).__name__}: {exc}") from None
        if spec.kind != kind:
            example = "memory-primary" if kind == "primary" else "memory"
            raise UsageError(
                f"{option} {name}: {name!r} is a {spec.kind} tier; {option} needs a {kind} tier (e.g. {example})"
            )
        specs.append((option, name, spec))
    return specs


def _built(
    specs: list[tuple[str, str, TierSpec]], options: list[dict[str, object]]
) -> tuple[PrimaryTier, list[SecondaryTier]]:
    """The primary, then each secondary over its buffer, built with their options (a secondary's
    capacity sized when none is given); on a usage error, every tier built so far is shut down."""
    from kvproto._protocols import PrimaryTier, SecondaryTier
    from kvproto._tier_names import hosted_factory
    from kvproto.testing._harness.tier_spec import shut_down_probe

    built: list[object] = []
    try:
        option, name, spec = specs[0]
        options[0] = _checked(option, name, spec.factory, options[0], 0)  # typed: the report shows them so
        primary: object = _call(option, name, spec.factory, options=options[0])
        built.append(primary)
        if not isinstance(primary, PrimaryTier):
            raise UsageError(f"{option} {name}: its factory built {primary!r}, which is not a PrimaryTier")
        secondaries: list[SecondaryTier] = []
        names = {primary.name}
        for index, (option, name, spec) in enumerate(specs[1:]):
            factory = hosted_factory(spec)  # the tier as an engine hosts it, with the same options (KIT-9)
            options[index + 1] = _checked(option, name, factory, _sized(factory, options[index + 1], index, primary), 1)
            tier: object = _call(option, name, factory, primary.buffer, options=options[index + 1])
            built.append(tier)
            if not isinstance(tier, SecondaryTier):
                raise UsageError(f"{option} {name}: its factory built {tier!r}, which is not a SecondaryTier")
            if tier.name in names:
                raise UsageError(f"{option} {name}: the tier's name {tier.name!r} is already used in the stack")
            names.add(tier.name)
            secondaries.append(tier)
    except UsageError:
        for tier in reversed(built):
            try:
                shut_down_probe(tier)
            except Exception:  # best effort while reporting the usage error
                pass
        raise
    return primary, secondaries


def _sized(factory: object, options: dict[str, object], index: int, primary: PrimaryTier) -> dict[str, object]:
    """``options``, sized when the command line did not: ``capacity_blocks`` of 4 ** (index + 1) primaries
    when the factory takes it, else ``capacity_bytes`` of as many blocks when it takes that (the one
    capacity contract, MGR-16); a factory taking neither keeps its own size, and the run says so."""
    from kvproto._simulation import CAPACITY_OPTIONS, default_capacity_blocks, takes_option

    if not callable(factory) or any(o in options for o in CAPACITY_OPTIONS):
        return options
    slots, block_bytes = (primary.buffer.shape or (1, 1))[:2]
    blocks = default_capacity_blocks(index, slots)
    if takes_option(factory, "capacity_blocks", positional=1):
        options["capacity_blocks"] = blocks
    elif takes_option(factory, "capacity_bytes", positional=1):
        options["capacity_bytes"] = blocks * block_bytes
    return options


def _checked(option: str, name: str, factory: object, options: dict[str, object], positional: int) -> dict[str, object]:
    from kvproto._simulation import TierOptionError, typed_options

    if not options or not callable(factory):
        return options
    try:
        return typed_options(name, factory, options, positional=positional)
    except TierOptionError as exc:
        raise UsageError(f"{option} {exc}") from None


def _call(option: str, name: str, factory: object, *args: object, options: dict[str, object] | None = None) -> object:
    if not callable(factory):
        raise UsageError(f"{option} {name}: its factory {factory!r} is not callable")
    try:
        return factory(*args, **(options or {}))
    except Exception as exc:
        raise UsageError(f"{option} {name}: building the tier failed: {type(exc).__name__}: {exc}") from None


def _simulate(
    console: Console,
    args: argparse.Namespace,
    stack_built: tuple[PrimaryTier, list[SecondaryTier], dict[str, dict[str, object]]],
    faults: FaultPlan,
    config_kwargs: dict[str, object],
    metrics: KvMetrics,
    trace: TracePlan | None = None,
) -> int:
    """Run the stack ``_build`` built (the tiers and the options each was built with, by argument name)."""
    from kvproto._simulation import CAPACITY_OPTIONS, SimConfig, render_html
    from kvproto.errors import ConfigurationError

    primary, secondaries, tier_options = stack_built
    unsized = [tier.name for tier, opts in zip(secondaries, list(tier_options.values())[1:], strict=True)
               if not any(o in opts for o in CAPACITY_OPTIONS)]
    try:
        config = SimConfig(**config_kwargs)  # type: ignore[arg-type]  # values checked by _parse
    except ConfigurationError as exc:
        primary.shutdown()
        for tier in secondaries:
            tier.shutdown()
        console.print(f"kvproto simulate: {exc}", style="red", markup=False, emoji=False, highlight=False, soft_wrap=True)
        return 2
    stack = " > ".join([primary.name, *(t.name for t in secondaries)])
    server = None
    if args.metrics_port is not None:
        try:
            server = metrics.serve(args.metrics_port)
        except OSError as exc:
            primary.shutdown()
            for tier in secondaries:
                tier.shutdown()
            console.print(f"kvproto simulate: --metrics-port {args.metrics_port}: cannot listen on 127.0.0.1: {exc}",
                          style="red", markup=False, emoji=False, highlight=False, soft_wrap=True)
            return 2
        console.print(f"metrics: {server.url}", markup=False, emoji=False, highlight=False, soft_wrap=True)
    for name in unsized:
        console.print(f"tier {name}: not sized by the simulator: its factory takes neither capacity_blocks nor "
                      "capacity_bytes, so it keeps its own size", style="yellow", markup=False, emoji=False,
                      highlight=False, soft_wrap=True)
    try:
        report = _run(console, primary, secondaries, config, metrics, stack, trace)
    finally:
        if server is not None:
            server.close()
    if report is None:
        return 2
    report.unsized = unsized
    _render(console, report, stack)
    if report.interrupted:
        console.print(f"interrupted after {report.seconds:.2f} s (step {report.steps:,}): the report covers the "
                      "time that ran", style="yellow", markup=False, emoji=False, highlight=False, soft_wrap=True)
    data = report.to_json()
    data["config"] = {
        "steps": config.steps,
        "seconds": config.seconds,
        "window": config.window,
        "max_live_requests": config.max_live_requests,
        "max_prompt_blocks": config.max_prompt_blocks,
        "stuck_steps": config.stuck_steps,
        "stuck_seconds": config.stuck_seconds,
        "step_ms": config.step_sleep_s * 1000.0,
        "tier_options": tier_options,
        "unsized": unsized,
        "max_failure_share": config.max_failure_share,
        "strict": bool(args.strict),
    }
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n")  # a Path option as its text
    if args.metrics is not None:
        args.metrics.write_text(metrics.exposition())
    if args.report is not None:
        args.report.write_text(render_html(data))
    return report.exit_code_strict() if args.strict else report.exit_code


def _run(
    console: Console,
    primary: PrimaryTier,
    secondaries: list[SecondaryTier],
    config: SimConfig,
    metrics: KvMetrics,
    stack: str,
    trace: TracePlan | None = None,
) -> SimReport | None:
    """The run under a progress display; None (after a printed usage error) when the stack cannot run."""
    from kvproto._cli.progress import progress_display
    from kvproto._simulation import SimProgress, run_simulation
    from kvproto.errors import ConfigurationError

    bound = " and ".join(
        part for part in (f"{config.steps:,} steps" if config.steps is not None else "",
                          f"{config.seconds:g} s" if config.seconds is not None else "") if part
    )
    console.print(f"simulating {stack} for {bound} (Ctrl-C ends it early and keeps the report)",
                  markup=False, emoji=False, highlight=False, soft_wrap=True)
    with progress_display(console, "[bold]simulate", "figures") as progress:
        task = progress.add_task("simulate", total=1000, figures=stack)

        def show(p: SimProgress) -> None:
            figures = (
                f"step {p.step:,}  {p.lookups:,} lookups  {p.requests_finished:,} requests  "
                f"{p.live_requests} live  wrong bytes {p.wrong_bytes}  stuck {p.stuck_requests}"
            )
            progress.update(task, completed=round(1000 * p.fraction), figures=figures)

        try:
            runner = run_simulation if trace is None else trace.replay()  # a replay of --trace (MGR-22)
            report = runner(primary, secondaries, config, on_progress=show, metrics=metrics)
        except ConfigurationError as exc:
            primary.shutdown()
            for tier in secondaries:
                tier.shutdown()
            progress.stop()
            console.print(f"kvproto simulate: {exc}", style="red", markup=False, emoji=False, highlight=False, soft_wrap=True)
            return None
        progress.update(task, completed=1000)
    return report


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 20):.1f} MiB"


def _render(console: Console, report: SimReport, stack: str) -> None:
    from rich.table import Table

    def verdict(bad: bool) -> str:
        return "[red]FAIL" if bad else "[green]ok"

    for name, why in report.failing_tiers().items():
        console.print(f"tier {name}: {why}", style="red", markup=False, emoji=False, highlight=False, soft_wrap=True)
    table = Table(title=f"kvproto simulate: {stack} (seed {report.seed})", title_justify="left")
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    table.add_column("", justify="center")
    add = table.add_row
    add("steps", f"{report.steps:,} in {report.seconds:.2f} s" + (" (interrupted)" if report.interrupted else ""), "")
    add("requests", f"{report.requests_started:,} started, {report.requests_finished:,} finished, "
        f"{report.requests_cancelled:,} cancelled", "")
    add("lookups", f"{report.lookups:,} ({report.lookups_per_second:,.0f}/s of the run's time) in {report.scans:,} scans "
        f"({report.window_scans:,} sliding-window)", "")
    rates = report.hit_rate()
    add("hit rate", ", ".join(f"{name} {rate:.1%}" for name, rate in rates.items()), "")
    add("blocks", f"{report.blocks_needed:,} needed, {report.blocks_stored:,} stored, "
        f"{report.blocks_skipped:,} skipped before a window", "")
    if report.trace is not None:  # a replay's own figures (MGR-22), as the HTML page shows them
        from kvproto._simulation import trace_rows

        for label, text in trace_rows(report.trace.to_json(report.tiers)):
            add(label, text, "")
    add("deferral steps", f"p50 {report.deferral_percentile(50)}, p99 {report.deferral_percentile(99)}, "
        f"max {max(report.deferral_histogram, default=0)}; longest wait {report.deferral_seconds_max * 1000:.1f} ms", "")
    add("wrong bytes", f"{report.wrong_bytes} blocks", verdict(report.wrong_bytes > 0))
    add("stuck requests", f"{report.stuck_requests} (deferred past the bound at the end: "
        f"{report.deferred_at_end})", verdict(report.stuck_requests > 0))
    if report.leaked_pins is None:
        add("leaked pins", report.leaked_pins_note, "[yellow]n/a")
    else:
        add("leaked pins", f"{report.leaked_pins} after shutdown", verdict(report.leaked_pins > 0))
    add("exceptions", f"{report.exceptions} escaped the manager", verdict(report.exceptions > 0))
    add("stores", f"{report.stores_prepared:,} prepared, {report.stores_refused:,} refused (no slot), "
        f"{report.stores_failed:,} failed, {report.stores_late:,} completed a step late", "")
    add("promoted", ", ".join(f"{n} {report.promoted.get(n, 0):,}" for n in report.secondaries) or "-", "")
    useless, failing = report.useless_tiers(), report.failing_tiers()
    for name, f in report.tier_figures.items():
        jobs, failed, late = report.jobs_gone_wrong(name)
        errors = report.tier_errors.get(name, 0)
        add(f"tier {name}", f"{f.lookups:,} lookups ({f.lookups_hit:,} HIT); stored {f.store.blocks:,} blocks in "
            f"{f.store.jobs:,} jobs ({_mib(f.store.bytes)}, {f.store.seconds:.2f} s); loaded {f.load.blocks:,} blocks "
            f"in {f.load.jobs:,} jobs ({_mib(f.load.bytes)}, {f.load.seconds:.2f} s); of its {jobs:,} jobs "
            f"{failed:,} failed, {late:,} timed out; {errors:,} errors logged; evicted {f.evicted_blocks:,} blocks",
            "[red]failing" if name in failing else "[yellow]useless" if name in useless else "")
    add("evicted", ", ".join(f"{n} {report.evicted.get(n, 0):,}" for n in report.tiers), "")
    stats = report.manager_stats
    add("manager", ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in stats.items()), "")
    if report.faults.any:
        c = report.fault_counts
        add("faults", f"fail {c.fail_fired}/{c.fail_armed} fired, corrupt {c.corrupt_detected}/{c.corrupt_armed} "
            f"detected ({c.corrupt_undetected} undetected), raise {c.raise_fired}/{c.raise_armed} fired, "
            f"latency {c.latency_steps} steps ({c.jobs_delayed:,} jobs)", "")
    if report.log_records:
        add("warnings logged", ", ".join(f"{k} {v:,}" for k, v in sorted(report.log_records.items())), "")
    indexed = ", ".join(f"{n} {k:,}" for n, k in report.end_indexed_keys.items())
    add("memory (RSS)", f"{_mib(report.rss_start)} -> {_mib(report.rss_end)}"
        + (f" (keys the tiers' indexes remember: {indexed}; bounded, RSS grows with them until full)"
           if indexed else ""), "")
    add("threads", f"{report.threads_start} -> {report.threads_end}", "")
    add("drain", f"{report.drain_steps} steps" + ("" if report.drained else ", work still pending"), "")
    console.print(table)
    _after_table(console, report)


def _after_table(console: Console, report: SimReport) -> None:
    """The samples of what went wrong, the warnings, then the verdict's line."""
    for title, samples in (
        ("wrong bytes", report.wrong_byte_samples),
        ("stuck", report.stuck_samples),
        ("exceptions", report.exception_samples),
    ):
        for sample in samples:
            console.print(f"  {title}: {sample}", style="red", markup=False, emoji=False, highlight=False, soft_wrap=True)
    for warning in report.warnings:
        console.print(f"  warning: {warning}", style="yellow", markup=False, emoji=False, highlight=False, soft_wrap=True)
    problems = report.problems
    if problems:
        console.print("[red]FAILED:[/red] " + "; ".join(problems), highlight=False)
    elif report.warnings:
        console.print("[yellow]not clean:[/yellow] no wrong bytes, no stuck requests, no leaked pins, but "
                      f"{len(report.warnings)} warning(s) (see above; --strict exits 1)", highlight=False)
    else:
        console.print("[green]clean:[/green] no wrong bytes, no stuck requests, no leaked pins, no tier lost "
                      f"more than {report.max_failure_share:.0%} of its jobs", highlight=False)
