"""Helpers for the object-store tier's tests: the moto server, configs, keys with known bytes, blocking job runs."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from kvproto import JobResult, OffloadKey, ReqContext, TransferJob, make_key
from kvproto import members as lr

from kvproto_obj import ObjTier, ObjTierConfig

BLOCK = 4096
SLOTS = 32
REGION = "us-east-1"
CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}


class S3Server:
    """moto's threaded S3 server on 127.0.0.1 (ephemeral port); ``stop`` and ``restart`` on the same port.

    moto keeps its buckets and objects in process memory, not in the server thread, so a server
    restarted on the same port serves what the stopped one held (as a real S3 outage would).
    """

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, self.port = self._server.get_host_and_port()
        assert host == "127.0.0.1"
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.running = True

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def restart(self) -> None:
        """Start a new server on the same port (the stopped one's port is free again)."""
        assert not self.running
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.running = True

    def config(self, bucket: str, **options: Any) -> ObjTierConfig:
        return config_for(options.pop("endpoint", self.endpoint), bucket, **options)


_CHILD_SERVER = (  # a moto server on an ephemeral port; it prints the port, serves until stdin closes
    "import logging, sys; logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
    "from moto.server import ThreadedMotoServer\n"
    "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start()\n"
    "print(s.get_host_and_port()[1], flush=True); sys.stdin.read(); s.stop()\n"
)


class S3ServerProcess:
    """moto's S3 server in a child process: its request threads are not this process's threads (the kit's
    shutdown check counts every thread started while a tier runs as the tier's)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD_SERVER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        self.endpoint = f"http://127.0.0.1:{int(self._proc.stdout.readline())}"

    def create_bucket(self, name: str) -> str:
        boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=name)
        return name

    def config(self, bucket: str, **options: Any) -> ObjTierConfig:
        return config_for(options.pop("endpoint", self.endpoint), bucket, **options)

    def stop(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def config_for(endpoint: str, bucket: str, **options: Any) -> ObjTierConfig:
    """A config for ``bucket`` on the server at ``endpoint``: short timeouts and few retries (tests)."""
    settings: dict[str, Any] = dict(
        kind="s3", bucket=bucket, endpoint=endpoint, region=REGION, allow_http=True,
        max_retries=1, retry_timeout_s=1.0, connect_timeout_s=0.5, request_timeout_s=5.0,
        job_timeout_s=10.0, max_concurrency=8, probe_concurrency=16, **CREDENTIALS,
    )
    settings.update(options)
    return ObjTierConfig(**settings)


def make_buffer(slots: int = SLOTS, block: int = BLOCK) -> memoryview:
    return memoryview(bytearray(slots * block)).cast("B", (slots, block))


def key(i: int, tag: bytes = b"k") -> OffloadKey:
    return make_key(hashlib.sha256(tag + i.to_bytes(8, "big")).digest(), i % 3)


def block_of(k: bytes, size: int = BLOCK) -> bytes:
    seed = hashlib.sha256(k).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Runner:
    """Submits jobs to a tier and waits for their results (tests only: it blocks)."""

    def __init__(self, tier: ObjTier, buffer: memoryview) -> None:
        self.tier = tier
        self.buffer = buffer
        self.flat = buffer.cast("B")
        self.block = buffer.shape[1] if buffer.shape else 0
        self.next_id = 1
        self.jobs: dict[int, TransferJob] = {}
        self.results: dict[int, JobResult] = {}
        self.req = ReqContext("test")
        self.steps = 0

    def row(self, slot: int) -> bytes:
        return bytes(self.flat[slot * self.block : (slot + 1) * self.block])

    def wait(self, job_id: int, timeout: float = 20.0) -> JobResult:
        """The result of job ``job_id`` (results of other jobs reported meanwhile are kept for their wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if job_id in self.results:
                return self.results.pop(job_id)
            self.tier.on_step_end()
            for result in self.tier.get_finished_jobs():
                self.results[result.job_id] = result
            if job_id not in self.results:
                time.sleep(0.0005)
        raise AssertionError(f"job {job_id} not reported within {timeout} s")

    def submit_job(self, keys: Sequence[OffloadKey], slots: Sequence[int], *, promotion: bool) -> int:
        """Submit a job over rows as they are (no filling, no clearing); its id."""
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), promotion)
        self.next_id += 1
        self.jobs[job.job_id] = job
        (self.tier.submit_load if promotion else self.tier.submit_store)(job)
        return job.job_id

    def submit_load_job(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> int:
        """Clear rows ``slots`` and submit a load of ``keys`` into them; its id."""
        for s in slots:
            self.flat[s * self.block : (s + 1) * self.block] = bytes(self.block)
        return self.submit_job(keys, slots, promotion=True)

    def submit_store(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None) -> int:
        slots = list(range(len(keys))) if slots is None else list(slots)
        for k, s in zip(keys, slots, strict=True):
            self.flat[s * self.block : (s + 1) * self.block] = block_of(k, self.block)
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), False)
        self.next_id += 1
        self.jobs[job.job_id] = job
        self.tier.submit_store(job)
        return job.job_id

    def store(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None) -> JobResult:
        return self.wait(self.submit_store(keys, slots))

    def load(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None
             ) -> tuple[JobResult, set[OffloadKey], set[OffloadKey]]:
        """(result, keys loaded with the right bytes, keys reported done with WRONG bytes)."""
        slots = list(range(len(keys))) if slots is None else list(slots)
        for s in slots:
            self.flat[s * self.block : (s + 1) * self.block] = bytes(self.block)
        job = TransferJob(self.next_id, tuple(keys), tuple(slots), True)
        self.next_id += 1
        self.jobs[job.job_id] = job
        self.tier.submit_load(job)
        result = self.wait(job.job_id)
        done = result.succeeded_keys(job)
        right = {k for k, s in zip(keys, slots, strict=True) if k in done and self.row(s) == block_of(k, self.block)}
        wrong = {k for k in done if k not in right}
        return result, right, wrong

    def resolve(self, keys: Sequence[OffloadKey], timeout: float = 10.0, req: ReqContext | None = None
                ) -> dict[OffloadKey, str]:
        """Ask until no key answers RETRY; the answers by name, and the steps it took in ``self.steps``."""
        req = self.req if req is None else req
        answers: dict[OffloadKey, str] = {}
        deadline = time.monotonic() + timeout
        waiting = list(keys)
        self.steps = 0
        while waiting and time.monotonic() < deadline:
            still = []
            for k in waiting:
                answer = self.tier.lookup(k, req)
                if answer is lr.RETRY:
                    still.append(k)
                else:
                    answers[k] = answer.name
            waiting = still
            if waiting:
                self.tier.on_step_end()
                self.steps += 1
                time.sleep(0.003)
        assert not waiting, f"{len(waiting)} keys still RETRY"
        return answers

    def finish(self) -> None:
        """End the current request (its verdicts go, AP-4) and start a new one."""
        self.tier.on_request_finished(self.req)
        self.req = ReqContext(f"test-{self.next_id}-{time.monotonic_ns()}")


def open_tier(config: ObjTierConfig, buffer: memoryview | None = None, **kwargs: Any) -> tuple[ObjTier, Runner]:
    buf = make_buffer() if buffer is None else buffer
    tier = ObjTier(buf, config, **kwargs)
    return tier, Runner(tier, buf)
