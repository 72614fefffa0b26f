"""An outage seen by ``kvproto simulate`` (issue 37): the S3 server behind the obj tier is stopped for
10 s in the middle of a run, then started again on the same port. The run is "not clean" (exit 1 under
``--strict``) with the obj tier named as failing and its first error on one line; the timeline counts
the jobs it lost during the outage and none before it; and the HTML page, rendered in headless Chromium,
shades the outage on its time axis (a clean run's page has no shade: test_simulate_report)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.impls.obj._support import REGION, S3ServerProcess
from tests.impls.sim_outage import BEFORE_S, OUTAGE_S, lost_over_time, simulate_with_outage
from tests.kvproto.test_simulate_report import png_pixels, rgb, screenshot

#: kvproto._simulation._html.OUTAGE: the shade of an interval in which a tier lost jobs or logged errors.
OUTAGE = "#fde0e0"


def objects_in(endpoint: str, bucket: str) -> int:
    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    return int(client.list_objects_v2(Bucket=bucket).get("KeyCount", 0))


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, str, dict[str, Any], Path]:
    """One run over memory and obj-on-moto whose server goes away for OUTAGE_S: (exit code, stdout,
    stderr, JSON report, HTML page)."""
    servers = [S3ServerProcess()]
    bucket = servers[0].create_bucket("outage")

    def start() -> None:
        servers.append(S3ServerProcess(port=servers[0].port))
        servers[-1].create_bucket(bucket)

    try:
        run = simulate_with_outage(
            tmp_path_factory.mktemp("outage"),
            ["--secondary", "memory", "--secondary", "tests.impls.obj.sim_stack:obj_on_moto"],
            env={"KVPROTO_SIM_S3_ENDPOINT": servers[0].endpoint, "KVPROTO_SIM_S3_BUCKET": bucket},
            storing=lambda: objects_in(servers[0].endpoint, bucket) >= 20, stop=servers[0].stop, start=start,
        )
    finally:
        servers[-1].stop()
    return run.code, run.out, run.err, run.data, run.page


def test_the_outage_makes_the_run_not_clean_and_names_the_tier(outage: tuple[int, str, str, dict[str, Any], Path]) -> None:
    code, out, err, data, _ = outage
    assert code == 1, out + err  # --strict: a failing tier is a warning, and warnings fail
    assert data["problems"] == [], data["problems"]  # nothing wrong was served
    assert data["clean"] is False
    (failing,) = [w for w in data["warnings"] if w.startswith("failing tier obj: ")]
    lost = data["tiers"]["obj"]["jobs_lost"]
    assert lost["lost"] > 0.05 * lost["jobs"] and lost["by_injected_faults"] == 0
    assert f"lost {lost['lost']:,} of its {lost['jobs']:,} jobs" in failing
    assert data["tiers"]["memory"]["jobs_lost"]["lost"] == 0
    assert "not clean" in out and "tier obj: lost" in out
    assert "Traceback" not in out + err  # what the tier logged is counted and summed up, not printed


def test_the_timeline_shows_the_outage_in_the_middle_of_the_run(outage: tuple[int, str, str, dict[str, Any], Path]) -> None:
    _, _, _, data, _ = outage
    seconds, lost = lost_over_time(data, "obj")
    first = next(i for i, n in enumerate(lost) if n > 0)
    assert seconds[first] > BEFORE_S / 2 and lost[:first] == [0] * first  # it worked before the server went away
    grown = [seconds[i] for i in range(1, len(seconds)) if lost[i] > lost[i - 1]]
    assert grown[-1] - grown[0] >= OUTAGE_S / 2  # losses spread over the outage, not one burst
    assert lost[-1] == data["tiers"]["obj"]["jobs_lost"]["failed"] + data["tiers"]["obj"]["jobs_lost"]["timed_out"]


def test_chromium_shows_the_outage_on_the_time_axis(
    outage: tuple[int, str, str, dict[str, Any], Path], tmp_path: Path
) -> None:
    _, _, _, data, page = outage
    text = page.read_text()
    assert text.count('class="outage"') >= 3  # on the hit-rate, throughput and failures plots
    assert "failing tier obj: " in text and "<th>verdict</th><td>not clean</td>" in text
    png, console = screenshot(page, tmp_path)
    assert console == []
    width, _, pixels = png_pixels(png)
    shaded = Counter(pixels[: width * 720])[rgb(OUTAGE)]
    # Three plots of 560 px wide, 168 px tall between their axes: an outage of 10 s in about 30 s shades
    # a third of each, far more than anti-aliasing could produce.
    assert shaded > 3 * 168 * 560 * 0.15, shaded
