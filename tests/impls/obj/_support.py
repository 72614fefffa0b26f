"""Helpers for the object-store tier's tests: the moto server, configs, keys with known bytes, blocking job runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from benchmarks._delay_proxy import stop_child
from kvproto_obj import ObjTier, ObjTierConfig
from tests.impls._tier_runner import Runner, make_buffer, shut_down_after

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


_CHILD_SERVER = (  # a moto server on the port in argv (0: an ephemeral one); it prints the port, serves until stdin closes
    "import logging, sys; logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
    "from moto.server import ThreadedMotoServer\n"
    "s = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False); s.start()\n"
    "print(s.get_host_and_port()[1], flush=True); sys.stdin.read(); s.stop()\n"
)


class S3ServerProcess:
    """moto's S3 server in a child process: its request threads are not this process's threads (the kit's
    shutdown check counts every thread started while a tier runs as the tier's)."""

    def __init__(self, port: int = 0) -> None:
        """A server on ``port`` of 127.0.0.1 (0: a free one); ``port`` lets a test restart a stopped server
        where its clients look for it."""
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD_SERVER, str(port)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        self.port = int(self._proc.stdout.readline())
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def create_bucket(self, name: str) -> str:
        boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=name)
        return name

    def config(self, bucket: str, **options: Any) -> ObjTierConfig:
        return config_for(options.pop("endpoint", self.endpoint), bucket, **options)

    def kill(self) -> None:
        """SIGKILL, no goodbye: what the server held is gone (a new one on :attr:`port` starts empty)."""
        self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()

    def stop(self) -> None:
        stop_child(self._proc)


def config_for(endpoint: str, bucket: str, **options: Any) -> ObjTierConfig:
    """A config for ``bucket`` on the server at ``endpoint``: short timeouts and few retries (tests)."""
    settings: dict[str, Any] = dict(
        kind="s3", bucket=bucket, endpoint=endpoint, region=REGION, allow_http=True,
        max_retries=1, retry_timeout_s=1.0, connect_timeout_s=0.5, request_timeout_s=5.0,
        job_timeout_s=10.0, max_concurrency=8, probe_concurrency=16, **CREDENTIALS,
    )
    settings.update(options)
    return ObjTierConfig(**settings)


def open_tier(config: ObjTierConfig, buffer: memoryview | None = None, **kwargs: Any) -> tuple[ObjTier, Runner[ObjTier]]:
    buf = make_buffer() if buffer is None else buffer
    tier = ObjTier(buf, config, **kwargs)
    return tier, Runner(tier, buf)


@contextmanager
def two_instances(config: ObjTierConfig) -> Iterator[tuple[tuple[ObjTier, Runner[ObjTier]], tuple[ObjTier, Runner[ObjTier]]]]:
    """Two tiers on one bucket, each with its own buffer and runner; both shut down when the block ends."""
    with shut_down_after(open_tier(config)) as first, shut_down_after(open_tier(config)) as second:
        yield first, second
