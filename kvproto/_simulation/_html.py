"""``kvproto simulate --report out.html``: one self-contained page of a run (:func:`render_html`).

Inline SVG only: no script, no stylesheet or font from the network, so the
page opens anywhere, offline. It plots, from the report's JSON
(:meth:`SimReport.to_json` plus ``config``): the hit rate of each tier over
time, throughput (lookups and finished requests per second), the
deferral-step histogram and each tier's promotion-latency histogram, the
jobs each secondary lost (failed or timed out) and the warnings logged per
second, then lists the same figures as the terminal table. Every interval in
which a tier lost a job or logged an error is shaded (``OUTAGE``) on each plot
over time, so an outage is seen at a glance on the same axis as the hit rates.
Each rate has one definition, shared with the JSON and the terminal: per second
of the run's wall-clock time. A plot with nothing to draw says "no data".
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvproto._simulation._replay_figures import trace_rows

__all__ = ["OUTAGE", "PALETTE", "render_html"]

#: Series colours, in order: the primary, then each secondary, then "computed".
PALETTE: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
#: The shade of an interval in which a tier lost jobs or logged errors (no series uses it).
OUTAGE = "#fde0e0"
#: The colour of the warnings-logged series.
_LOGGED = "#7f7f7f"
_W, _H, _PAD = 560, 240, 44


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _axes(title: str, x_label: str, y_label: str, y_max: float, y_fmt: str) -> list[str]:
    parts = [
        f'<text x="{_W / 2}" y="16" text-anchor="middle" class="title">{_esc(title)}</text>',
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - 10}" y2="{_H - _PAD}" class="axis"/>',
        f'<line x1="{_PAD}" y1="28" x2="{_PAD}" y2="{_H - _PAD}" class="axis"/>',
        f'<text x="{_W / 2}" y="{_H - 8}" text-anchor="middle" class="label">{_esc(x_label)}</text>',
        f'<text x="12" y="{_H / 2}" text-anchor="middle" class="label" transform="rotate(-90 12 {_H / 2})">'
        f"{_esc(y_label)}</text>",
    ]
    for i in range(5):
        value = y_max * i / 4
        y = _y(value, y_max)
        parts.append(f'<line x1="{_PAD}" y1="{y:.1f}" x2="{_W - 10}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{_PAD - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{format(value, y_fmt)}</text>')
    return parts


def _nice_top(largest: float, *, whole: bool) -> tuple[float, str]:
    """An axis's top above ``largest`` (with a tenth to spare) and its ticks' format: four equal steps of
    a round number (whole numbers on a count axis), printed with just the decimals they need, so that no
    two ticks read alike. An axis with nothing above zero reads 0..4."""
    if largest <= 0:
        return 4.0, ",.0f"
    want = largest * 1.1 / 4
    power = 10.0 ** math.floor(math.log10(want))
    step = next(m * power for m in _ROUND_STEPS if m * power >= want * (1 - 1e-9))
    if whole:
        step = float(max(1, math.ceil(step)))
    decimals = next(d for d in range(13) if abs(round(step, d) - step) <= step * 1e-9)
    return 4 * step, f",.{decimals}f"


#: The multiples of a power of ten an axis steps by.
_ROUND_STEPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def _no_data(parts: list[str]) -> None:
    parts.append(f'<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle" class="nodata">no data</text>')


def _y(value: float, y_max: float) -> float:
    span = _H - _PAD - 28
    return _H - _PAD - (value / y_max * span if y_max > 0 else 0.0)


def _x(i: float, n: float) -> float:
    return _PAD + (i / n if n > 0 else 0.0) * (_W - 10 - _PAD)


def _svg(plot_id: str, parts: Sequence[str]) -> str:
    body = "\n".join(parts)
    return (
        f'<svg id="{plot_id}" class="plot" xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img">\n{body}\n</svg>'
    )


def _legend(names: Sequence[str], colours: Sequence[str]) -> list[str]:
    parts: list[str] = []
    x = _PAD + 6
    for name, colour in zip(names, colours, strict=True):
        parts.append(f'<rect x="{x}" y="30" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{x + 14}" y="39" class="tick">{_esc(name)}</text>')
        x += 22 + 7 * len(name)
    return parts


def _lines(plot_id: str, title: str, x_label: str, y_label: str, xs: Sequence[float],
           series: Mapping[str, Sequence[float]], colours: Sequence[str], *, y_max: float | None, y_fmt: str,
           bands: Sequence[tuple[float, float]] = ()) -> str:
    largest = max((max(v, default=0.0) for v in series.values()), default=0.0)
    if y_max is None:
        top, y_fmt = _nice_top(largest, whole=y_fmt.endswith(".0f"))
    else:
        top = y_max
    parts = _axes(title, x_label, y_label, top, y_fmt)
    x_end = xs[-1] if xs else 0.0
    if not xs:
        _no_data(parts)
        return _svg(plot_id, parts)
    parts.append(f'<text x="{_PAD}" y="{_H - _PAD + 14}" text-anchor="middle" class="tick">0</text>')
    parts.append(f'<text x="{_W - 10}" y="{_H - _PAD + 14}" text-anchor="end" class="tick">{x_end:.3g}</text>')
    for start, end in bands:  # under the series
        left, right = _x(start, x_end), _x(end, x_end)
        parts.append(f'<rect class="outage" x="{left:.1f}" y="28" width="{max(2.0, right - left):.1f}" '
                     f'height="{_H - _PAD - 28}" fill="{OUTAGE}"><title>jobs lost or errors logged</title></rect>')
    for (name, values), colour in zip(series.items(), colours, strict=False):
        if not values:
            continue
        points = " ".join(f"{_x(x, x_end):.1f},{_y(v, top):.1f}" for x, v in zip(xs, values, strict=True))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2.5">'
                     f"<title>{_esc(name)}</title></polyline>")
    parts += _legend(list(series), list(colours)[: len(series)])
    return _svg(plot_id, parts)


def _bars(plot_id: str, title: str, x_label: str, bins: Sequence[tuple[str, int]], colour: str) -> str:
    top, fmt = _nice_top(max((c for _, c in bins), default=0), whole=True)
    parts = _axes(title, x_label, "count", top, fmt)
    if not any(c for _, c in bins):
        _no_data(parts)
        return _svg(plot_id, parts)
    n = max(1, len(bins))
    width = (_W - 10 - _PAD) / n
    for i, (label, count) in enumerate(bins):
        x = _PAD + i * width
        y = _y(count, top)
        parts.append(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(1.0, width - 2):.1f}" '
                     f'height="{_H - _PAD - y:.1f}" fill="{colour}"><title>{_esc(label)}: {count}</title></rect>')
        if n <= 8 or i % 2 == 0:
            parts.append(f'<text x="{x + width / 2:.1f}" y="{_H - _PAD + 14}" text-anchor="middle" class="tick">'
                         f"{_esc(label)}</text>")
    return _svg(plot_id, parts)


def _histogram_bins(cumulative: Mapping[str, int]) -> list[tuple[str, int]]:
    """Per-bucket counts from Prometheus-style cumulative ones (``le`` bound -> count)."""
    out: list[tuple[str, int]] = []
    before = 0
    for bound, seen in cumulative.items():
        out.append((f"≤{bound}" if bound != "+Inf" else f">{list(cumulative)[-2] if len(cumulative) > 1 else 0}",
                    seen - before))
        before = seen
    return out


def _deferral_bins(histogram: Mapping[str, int]) -> list[tuple[str, int]]:
    from kvproto.metrics import STEP_BUCKETS

    counts = [0] * (len(STEP_BUCKETS) + 1)
    for steps, n in histogram.items():
        value = int(steps)
        index = next((i for i, b in enumerate(STEP_BUCKETS) if value <= b), len(STEP_BUCKETS))
        counts[index] += n
    labels = [f"≤{int(b)}" for b in STEP_BUCKETS] + [f">{int(STEP_BUCKETS[-1])}"]
    return list(zip(labels, counts, strict=True))


class _Timeline:
    """The plots over time, from the timeline's cumulative points: one value per interval between two
    points, at the interval's end. Rates are per second of wall-clock time."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        points: list[Mapping[str, Any]] = data["timeline"]["points"]
        tiers: list[str] = [data["stack"]["primary"], *data["stack"]["secondaries"]]
        secondaries: list[str] = list(data["stack"]["secondaries"])
        self.xs: list[float] = []
        self.rates: dict[str, list[float]] = {name: [] for name in [*tiers, "computed"]}
        self.speed: dict[str, list[float]] = {"lookups/s": [], "requests/s": []}
        self.losses: dict[str, list[float]] = {f"{name} jobs lost/s": [] for name in secondaries}
        self.losses["warnings logged/s"] = []
        self.bands: list[tuple[float, float]] = []
        for before, after in zip(points, points[1:], strict=False):
            self._interval(before, after, tiers, secondaries)

    def _interval(self, before: Mapping[str, Any], after: Mapping[str, Any], tiers: list[str],
                  secondaries: list[str]) -> None:
        def grew(field: str, name: str) -> int:
            return int(after.get(field, {}).get(name, 0)) - int(before.get(field, {}).get(name, 0))

        start, end = float(before["seconds"]), float(after["seconds"])
        dt = end - start
        self.xs.append(end)
        needed = after["blocks_needed"] - before["blocks_needed"]
        served_total = 0
        for name in tiers:
            served = grew("served", name)
            served_total += served
            self.rates[name].append(served / needed if needed > 0 else 0.0)
        self.rates["computed"].append((needed - served_total) / needed if needed > 0 else 0.0)
        self.speed["lookups/s"].append((after["lookups"] - before["lookups"]) / dt if dt > 0 else 0.0)
        self.speed["requests/s"].append((after["requests_finished"] - before["requests_finished"]) / dt if dt > 0 else 0.0)
        bad = False
        for name in secondaries:
            lost = grew("failed_jobs", name)
            bad = bad or lost > 0 or grew("errors", name) > 0
            self.losses[f"{name} jobs lost/s"].append(lost / dt if dt > 0 else 0.0)
        logged = int(after.get("logged", 0)) - int(before.get("logged", 0))
        self.losses["warnings logged/s"].append(logged / dt if dt > 0 else 0.0)
        if bad or grew("errors", tiers[0]) > 0:
            if self.bands and self.bands[-1][1] == start:
                self.bands[-1] = (self.bands[-1][0], end)  # one band over consecutive bad intervals
            else:
                self.bands.append((start, end))


def _secs(value: float) -> str:
    return f"{value:.2f} s"


def _verdict(data: Mapping[str, Any]) -> str:
    said = "clean" if data["clean"] else ("FAILED" if data["problems"] else "not clean")
    return f"interrupted ({said} while it ran)" if data.get("interrupted") else said


def _tier_row(name: str, t: Mapping[str, Any]) -> tuple[str, str]:
    lk, lost = t["lookups"], t["jobs_lost"]
    first = f"; first: {t['first_error']}" if t.get("first_error") else ""
    return f"tier {name}", (
        f"lookups hit {lk['hit']:,} / miss {lk['miss']:,} / retry {lk['retry']:,}; stored {t['stored_blocks']:,} blocks "
        f"in {t['jobs']['store']['submitted']:,} jobs ({t['stored_bytes']:,} B, {_secs(t['store_seconds'])}); loaded "
        f"{t['loaded_blocks']:,} blocks in {t['jobs']['load']['submitted']:,} jobs ({t['loaded_bytes']:,} B, "
        f"{_secs(t['load_seconds'])}); "
        f"served {t['served_blocks']:,} blocks; jobs lost {lost['lost']:,} of {lost['jobs']:,} ({lost['share']:.1%}: "
        f"{lost['failed']:,} failed, {lost['timed_out']:,} timed out, {lost['by_injected_faults']:,} by injected faults); "
        f"errors logged {t['errors_logged']:,}{first}; evicted {t['evicted_blocks']:,} blocks"
    )


def _rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    d = data["deferral_steps"]
    rows = [
        ("verdict", _verdict(data)),
        ("steps", f"{data['steps']:,} in {_secs(data['seconds'])} ({data['config'].get('step_ms', 0):g} ms per step)"),
        ("requests", ", ".join(f"{k} {v:,}" for k, v in data["requests"].items())),
        ("lookups", f"{data['lookups']:,} ({data['lookups_per_second']:,}/s)"),
        ("hit rate", ", ".join(f"{k} {v:.1%}" for k, v in data["hit_rate"].items()) + " of the blocks needed"),
        ("blocks", ", ".join(f"{k} {v:,}" for k, v in data["blocks"].items() if not isinstance(v, dict))),
        ("deferral steps", f"p50 {d['p50']}, p99 {d['p99']}, max {d['max']}"),
        ("wrong bytes", str(data["wrong_bytes"])),
        ("stuck requests", str(data["stuck_requests"])),
        ("leaked pins", str(data["leaked_pins"])),
        ("exceptions", str(data["exceptions"])),
        ("stores (jobs)", ", ".join(f"{k} {v:,}" for k, v in data["stores"].items())),
        ("promoted (blocks)", ", ".join(f"{k} {v:,}" for k, v in data["promoted"].items()) or "-"),
        ("evicted (blocks)", ", ".join(f"{k} {v:,}" for k, v in data["evicted"].items())),
    ]
    rows += [_tier_row(name, t) for name, t in data.get("tiers", {}).items()]
    rows.append(("manager", ", ".join(f"{k} {v:,}" for k, v in data["manager"].items())))
    logged = data.get("log_records", {})
    rows.append(("warnings logged", ", ".join(f"{k} {v:,}" for k, v in sorted(logged.items())) or "none"))
    if "trace" in data:  # a replay's own figures (MGR-22), as the terminal table shows them
        rows += trace_rows(data["trace"])
    return rows


def render_html(data: Mapping[str, Any]) -> str:
    """The page for one run's JSON report (with ``config``), as a string."""
    tiers = [data["stack"]["primary"], *data["stack"]["secondaries"]]
    colours = list(PALETTE)
    line = _Timeline(data)
    xs, bands = line.xs, line.bands
    seconds = "seconds of trace time" if "trace" in data else "seconds"  # a replay's timeline is in trace time (MGR-22)
    per = "per second" + seconds.removeprefix("seconds")
    plots = [
        _lines("hit-rate", "hit rate per tier over time", seconds, "share of needed blocks", xs, line.rates,
               colours, y_max=1.0, y_fmt=".0%", bands=bands),
        _lines("throughput", "throughput", seconds, per, xs, line.speed,
               [colours[0], colours[3]], y_max=None, y_fmt=",.0f", bands=bands),
        _lines("failures", "jobs lost and warnings logged over time", seconds, per, xs, line.losses,
               [*colours[1 : len(line.losses)], _LOGGED], y_max=None, y_fmt=",.1f", bands=bands),
        _bars("deferral-steps", "deferral steps per decided request", "steps deferred",
              _deferral_bins(data["deferral_steps"]["histogram"]), colours[4]),
    ]
    for i, (name, t) in enumerate(data.get("tiers", {}).items()):
        hist = t["promotion_latency_seconds"]["success"]["buckets"]
        plots.append(_bars(f"promotion-latency-{i}", f"promotion latency from {name} (seconds)", "seconds",
                           _histogram_bins(hist), colours[(i + 1) % len(colours)]))
    warnings = "".join(f"<li class='warn'>{_esc(w)}</li>" for w in data.get("warnings", []))
    problems = "".join(f"<li class='bad'>{_esc(p)}</li>" for p in data.get("problems", []))
    rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in _rows(data))
    stack = " &gt; ".join(_esc(t) for t in tiers)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvproto simulate: {stack}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; background: #fff; }}
.plots {{ display: flex; flex-wrap: wrap; gap: 12px; }}
svg.plot {{ border: 1px solid #ccc; background: #fafafa; }}
.title {{ font-size: 13px; font-weight: bold; }} .label {{ font-size: 11px; fill: #444; }}
.tick {{ font-size: 10px; fill: #555; }} .nodata {{ font-size: 14px; fill: #999; }}
.axis {{ stroke: #333; }} .grid {{ stroke: #e4e4e4; }}
table {{ border-collapse: collapse; margin-top: 16px; }} th, td {{ border: 1px solid #ddd; padding: 4px 8px;
text-align: left; vertical-align: top; font-size: 13px; }} .warn {{ color: #a60; }} .bad {{ color: #b00; }}
</style></head>
<body>
<h1>kvproto simulate: {stack}</h1>
<p>seed {_esc(data["seed"])}, kvproto {_esc(data["kvproto_version"])}</p>
<ul>{problems}{warnings}</ul>
<div class="plots">
{chr(10).join(plots)}
</div>
<table id="figures">{rows}</table>
</body></html>
"""
