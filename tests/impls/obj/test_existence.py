"""The object-store tier's existence checks over the network: front first, chunk by chunk, each key alone
(AP-9, TIERKIT-5), also behind the benchmarks' delay proxy (a server 2 ms away each way)."""

from __future__ import annotations

from kvproto import ReqContext, members as lr

from benchmarks._delay_proxy import delay_proxy
from kvproto_obj import ObjTier
from tests.impls._tier_runner import key, shut_down_after
from tests.impls.obj._support import S3Server, open_tier

REQ = ReqContext("scan")
NO_DEADLINE = 1_000_000


def test_existence_checks_behind_a_delay_proxy_answer_each_key(s3_server: S3Server, bucket: str) -> None:
    """200 keys (a chunk of 64 and more), every third stored, asked in one step of a second instance that
    reaches the server through the delay proxy: each answers as stored, and the proxy carried it all."""
    keys = [key(i, b"far") for i in range(200)]
    stored = keys[::3]
    with shut_down_after(open_tier(s3_server.config(bucket))) as (_, writer):
        for start in range(0, len(stored), 16):
            assert writer.store(stored[start : start + 16]).success
    with delay_proxy(s3_server.port, 2.0) as port:
        far = s3_server.config(bucket, endpoint=f"http://127.0.0.1:{port}", probe_min_interval_s=0.0,
                               probe_deadline_steps=NO_DEADLINE)
        with shut_down_after(open_tier(far)) as (tier, runner):
            assert isinstance(tier, ObjTier)
            assert all(tier.lookup(k, REQ) is lr.RETRY for k in keys)
            answers = runner.resolve(keys, timeout=60, req=REQ)
            assert [answers[k] for k in keys] == ["HIT" if k in stored else "MISS" for k in keys]
            assert tier.stats.probe_errors == 0


def test_a_malformed_key_fails_alone_on_the_object_store(s3_server: S3Server, bucket: str) -> None:
    """TIERKIT-5 on the object store: a malformed key asked with stored ones is MISS alone."""
    good = [key(i, b"obj") for i in range(6)]
    with shut_down_after(open_tier(s3_server.config(bucket))) as (_, writer):
        assert writer.store(good).success
    config = s3_server.config(bucket, probe_deadline_steps=NO_DEADLINE)
    with shut_down_after(open_tier(config)) as (tier, runner):
        bad = "not bytes"
        answers = runner.resolve([*good, bad], req=REQ)  # type: ignore[list-item]  # the malformed key
        assert [answers[k] for k in good] == ["HIT"] * 6
        assert answers[bad] == "MISS"  # type: ignore[index]  # the malformed key
