"""``kvproto simulate --report out.html``: one self-contained page, rendered in headless Chromium.

The browser test loads the page from a file with the network off, asserts the
console stayed silent (the check is shown to catch a broken page), and reads
the screenshot's pixels: every plot drew its series in its colours. It needs
Debian's chromium (``apt-get install -y --no-install-recommends chromium``;
.ci/run installs it): skipped with that reason outside CI, failed in CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.cli import kvproto_cli

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
WINDOW = (1280, 1400)
#: The page's series colours, in order (kvproto._simulation._html.PALETTE): the primary,
#: each secondary, then "computed"; the deferral bars take the fifth.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
#: kvproto._simulation._html.OUTAGE: the shade of an interval in which a tier lost jobs or logged errors.
OUTAGE = "#fde0e0"


def chromium() -> str:
    """The chromium binary; skipped outside CI when it is missing, failed in CI (CI=true)."""
    found = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else shutil.which("chromium")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing in CI: .ci/run installs it (apt-get install chromium)")
        pytest.skip("needs chromium: apt-get install -y --no-install-recommends chromium")
    return found


def screenshot(page: Path, tmp_path: Path) -> tuple[bytes, list[str]]:
    """Render ``page`` in headless Chromium: (PNG bytes, its console lines)."""
    shot = tmp_path / f"{page.stem}.png"
    done = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / f'profile-{page.stem}'}",
         "--enable-logging=stderr", "--v=0", f"--window-size={WINDOW[0]},{WINDOW[1]}",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.exists(), done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return shot.read_bytes(), console


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB pixels) of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = prev[i], (prev[i - channels] if i >= channels else 0)
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(line)
        prev = line
    pixels = [
        (row[x * channels], row[x * channels + 1], row[x * channels + 2]) for row in rows for x in range(width)
    ]
    return width, height, pixels


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One run over memory and memory-async (every plot has data): its page and JSON."""
    folder = tmp_path_factory.mktemp("report")
    page, report = folder / "run.html", folder / "run.json"
    code = kvproto_cli([
        "simulate", "--steps", "800", "--step-ms", "1", "--secondary", "memory", "--secondary", "memory-async",
        "--report", str(page), "--json", str(report),
    ])
    assert code == 0
    return page, json.loads(report.read_text())


def test_the_page_is_self_contained_and_holds_the_tables_figures(run: tuple[Path, dict[str, Any]]) -> None:
    page, data = run
    text = page.read_text()
    assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|\bhref=|@import|url\(", text)  # nothing to fetch
    for plot in ("hit-rate", "throughput", "failures", "deferral-steps", "promotion-latency-0", "promotion-latency-1"):
        assert f'id="{plot}"' in text, plot
    figures = text.split('<table id="figures">')[1]
    assert "<th>verdict</th><td>clean</td>" in figures
    assert f"<th>wrong bytes</th><td>{data['wrong_bytes']}</td>" in figures
    assert f"{data['lookups']:,} ({data['lookups_per_second']:,}/s)" in figures
    for name, rate in data["hit_rate"].items():
        assert f"{name} {rate:.1%}" in figures
    assert f"stored {data['tiers']['memory']['stored_blocks']:,} blocks" in figures


def test_a_useless_tier_is_on_the_page(tmp_path: Path) -> None:
    page, report = tmp_path / "useless.html", tmp_path / "useless.json"
    code = kvproto_cli(["simulate", "--secondary", "tests.kvproto.sim_tiers:refusing_memory", "--steps", "300",
                        "--step-ms", "0", "--report", str(page), "--json", str(report)])
    assert code == 0
    warnings = json.loads(report.read_text())["warnings"]
    assert [w.split(":")[0] for w in warnings] == ["failing tier refusing", "useless tier refusing"]
    text = page.read_text()
    assert all(f"<li class='warn'>{w}</li>" in text for w in warnings) and "<th>verdict</th><td>not clean</td>" in text


def test_chromium_renders_the_page_without_console_errors_and_with_plots(
    run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    page, _ = run
    png, console = screenshot(page, tmp_path)
    assert console == []
    width, height, pixels = png_pixels(png)
    assert (width, height) == WINDOW
    plots = pixels[: width * 720]  # the three rows of plots lie above the table
    counts = Counter(plots)
    assert len(counts) > 50  # text, axes, anti-aliased curves: not a blank area
    # Each series drew in its colour: the hit-rate curves (primary, memory, memory-async, computed) and
    # the deferral bars, each far beyond a 10x10 legend square.
    for colour in PALETTE[:5]:
        assert counts[rgb(colour)] > 300, colour
    assert counts[rgb(OUTAGE)] == 0  # no tier lost a job: nothing is shaded (tests/impls/obj/test_sim_outage.py)


def test_the_console_check_catches_a_broken_page(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefined_function();</script></body></html>")
    _, console = screenshot(page, tmp_path)
    assert any("undefined_function is not defined" in line for line in console)


def test_empty_plots_say_no_data_and_count_axes_tick_whole_numbers(tmp_path: Path) -> None:
    """A run of one step has no interval to plot and no promotion: each such plot says "no data"; a
    count axis never labels its ticks 0 0 0 1 1."""
    page = tmp_path / "short.html"
    assert kvproto_cli(["simulate", "--steps", "1", "--step-ms", "0", "--report", str(page)]) == 0
    text = page.read_text()
    for plot in ("hit-rate", "throughput", "failures", "promotion-latency-0"):
        svg = text.split(f'<svg id="{plot}"')[1].split("</svg>")[0]
        assert ">no data</text>" in svg, plot
        ticks = re.findall(r'class="tick">([^<]*)</text>', svg)
        assert len(ticks) == len(set(ticks)), (plot, ticks)
