"""ObjTier under faults of a real S3 server: stopped mid-run and restarted, black-holed, and a writer
killed with SIGKILL in the middle of its PUTs (OBJ-8, OBJ-3)."""

from __future__ import annotations

import hashlib
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from kvproto import EventKind, OffloadKey, envelope as env, make_key
from kvproto.errors import ConfigurationError

obj = pytest.importorskip("kvproto_obj", reason="kvproto-obj is not installed: pip install -e impls/obj (./dev does it)")
from tests.impls._tier_runner import block_of, key, make_buffer  # noqa: E402 (after importorskip: the obj tier may be absent)
from tests.impls.obj._support import S3Server, open_tier  # noqa: E402 (after importorskip: the obj tier may be absent)

# Every end-of-step hook counts for the existence checks (probe_min_interval_s=0), so "within the declared
# steps" is checked hook for hook.
OUTAGE = dict(max_retries=1, retry_timeout_s=1.0, connect_timeout_s=0.5, request_timeout_s=2.0, job_timeout_s=3.0,
              probe_min_interval_s=0.0)


def test_server_stopped_mid_run_jobs_fail_in_time_lookups_miss_and_the_tier_recovers(own_s3_server: S3Server) -> None:
    server = own_s3_server
    bucket = server.create_bucket("kvproto-outage")
    config = server.config(bucket, **OUTAGE)
    tier, run = open_tier(config)
    try:
        stored = [key(i) for i in range(4)]
        assert run.store(stored).success
        # Stopped while a job runs: the job ends (some keys may have made it), never raises, within the bound.
        flying = run.submit_store([key(i) for i in range(10, 16)], range(4, 10))
        server.stop()
        t0 = time.monotonic()
        in_flight = run.wait(flying)
        assert time.monotonic() - t0 < config.job_timeout_s + 4.0  # the bound, with slack for a loaded machine
        survivors = in_flight.succeeded_keys(run.jobs[flying])
        # While it is down: a store fails within the bound...
        t0 = time.monotonic()
        down = run.store([key(20)], [12])
        assert not down.success and down.succeeded is None
        assert time.monotonic() - t0 < config.job_timeout_s + 4.0  # the bound, with slack for a loaded machine
        # ...a load of stored blocks fails, serves nothing, and never reports them removed (TIERKIT-3)...
        tier.take_events()
        result, right, wrong = run.load(stored[:2], [14, 15])
        assert not result.success and not right and not wrong
        assert not [e for e in tier.take_events() if e.kind is EventKind.REMOVED]
        # ...and lookups (of keys it stored, and others) end in MISS within the declared steps.
        answers = run.resolve([*stored[:2], key(20), key(21)])
        assert set(answers.values()) == {"MISS"}
        assert run.steps <= config.probe_deadline_steps
        assert not tier.has_pending_work()

        # The outage's checks may still be failing on the probe's worker after their verdicts expired:
        # let them end, or the next request's batch waits behind them past its own deadline.
        assert tier.wait_idle(30)
        server.restart()  # same port, same objects: the tier is not restarted
        run.finish()  # a new request: the outage's verdicts are gone (AP-4)
        answers = run.resolve([*stored, key(20)])
        assert answers == {**{k: "HIT" for k in stored}, key(20): "MISS"}
        assert run.store([key(20)], [12]).success
        back = [*stored, key(20), *survivors]
        result, right, wrong = run.load(back, range(16, 16 + len(back)))
        assert result.success and right == set(back) and not wrong
    finally:
        tier.shutdown()


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a request stalls until its timeout)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)  # never accepted: the kernel completes handshakes into the backlog
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_black_holed_endpoint_fails_jobs_and_lookups_within_the_configured_time(
    s3_server: S3Server, black_hole: str
) -> None:
    stall = dict(request_timeout_s=0.5, connect_timeout_s=0.5, max_retries=0, job_timeout_s=1.5, probe_timeout_s=1.0,
                 probe_min_interval_s=0.0)
    t0 = time.monotonic()
    with pytest.raises(ConfigurationError, match="manifest.json"):
        obj.ObjTier(make_buffer(), s3_server.config("stalled", endpoint=black_hole, **stall))
    assert time.monotonic() - t0 < 8.0  # the start-up check's own timeouts (1 s), not obstore's minutes
    config = s3_server.config("stalled", endpoint=black_hole, check_on_start=False, **stall)
    tier, run = open_tier(config)
    try:
        t0 = time.monotonic()
        result = run.store([key(1), key(2)])
        assert not result.success and result.succeeded is None
        assert time.monotonic() - t0 < config.job_timeout_s + 4.0  # the bound, with slack for a loaded machine
        t0 = time.monotonic()
        result, right, wrong = run.load([key(1)], [5])
        assert not result.success and not right and not wrong
        assert time.monotonic() - t0 < config.job_timeout_s + 4.0  # the bound, with slack for a loaded machine
        answers = run.resolve([key(1), key(3)])
        assert answers == {key(1): "MISS", key(3): "MISS"}
        assert run.steps <= config.probe_deadline_steps
    finally:
        t0 = time.monotonic()
        tier.shutdown()
        assert time.monotonic() - t0 < 15.0  # never waits forever on a hung request


_WRITER = textwrap.dedent(
    """
    import hashlib, sys, time
    from kvproto import TransferJob, make_key
    from kvproto_obj import ObjTier, ObjTierConfig

    endpoint, bucket, tag, block = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    per_job = 4
    buf = memoryview(bytearray(per_job * block)).cast("B", (per_job, block))
    flat = buf.cast("B")
    tier = ObjTier(buf, ObjTierConfig(kind="s3", bucket=bucket, endpoint=endpoint, region="us-east-1",
                                      allow_http=True, access_key_id="testing", secret_access_key="testing",
                                      prefix="crash"))
    print("ready", flush=True)
    for i in range(10**6):
        keys = tuple(make_key(hashlib.sha256(f"{tag}-{i}-{j}".encode()).digest(), 0) for j in range(per_job))
        for j, k in enumerate(keys):
            seed = hashlib.sha256(k).digest()
            flat[j * block:(j + 1) * block] = (seed * (block // 32 + 1))[:block]
        print("submitted", i, flush=True)
        tier.submit_store(TransferJob(i + 1, keys, tuple(range(per_job)), False))
        while not tier.get_finished_jobs():
            time.sleep(0.0005)
        print("done", i, flush=True)
    """
)


def test_kill_minus_nine_in_the_middle_of_puts_never_leaves_a_partial_object(s3_server: S3Server, bucket: str) -> None:
    """A writer process storing 1 MiB blocks is SIGKILLed at random moments; every object left is complete,
    and a fresh tier answers HIT only for blocks that load with their exact bytes."""
    block = 1 << 20
    rng = random.Random(11)
    mid_job = 0
    rounds = 5
    for r in range(rounds):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, s3_server.endpoint, bucket, f"r{r}", str(block)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        last = "ready"
        if r % 2 == 0:
            # Even rounds kill while a job's PUTs are in flight: right after the writer says it submitted
            # its third job (4 PUTs of 1 MiB each to moto take far longer than the signal's delivery).
            while not last.startswith("submitted 2"):
                last = proc.stdout.readline().strip()
                assert last, "the writer ended before submitting its third job"
        else:
            time.sleep(rng.uniform(0.05, 0.4))  # odd rounds: at a seeded random moment
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        lines = [last, *proc.stdout.read().splitlines()]
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        if lines[-1].startswith("submitted"):
            mid_job += 1
    assert mid_job >= 1  # the kills of even rounds land inside a job's PUTs
    listed = [o["Key"] for page in s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
              for o in page.get("Contents", []) if o["Key"].endswith(".kvb")]
    assert listed, "the writers stored nothing before being killed"
    buf = make_buffer(8, block)
    # moto answers a HEAD in ~8 ms, one at a time: give the checks of every listed key time to finish.
    tier, run = open_tier(s3_server.config(bucket, prefix="crash", probe_deadline_steps=10_000), buf)
    try:
        found: list[OffloadKey] = []
        for name in listed:
            body = s3_server.client().get_object(Bucket=bucket, Key=name)["Body"].read()
            header = env.decode_header(body)  # a partial object would fail here or below
            payload = env.verify(body, key=header.key, namespace=tier.namespace, payload_len=block)
            assert bytes(payload) == block_of(header.key, block)
            assert tier.path_of(OffloadKey(header.key)) == name
            found.append(OffloadKey(header.key))
        never = [make_key(hashlib.sha256(f"never-{i}".encode()).digest(), 0) for i in range(2)]
        answers = run.resolve([*found, *never], timeout=30)
        assert answers == {**{k: "HIT" for k in found}, **{k: "MISS" for k in never}}
        for i in range(0, len(found), 8):
            chunk = found[i : i + 8]
            result, right, wrong = run.load(chunk, range(len(chunk)))
            assert result.success and right == set(chunk) and not wrong
    finally:
        tier.shutdown()
