"""``redis`` named with options outside the kit (issue 38): ``kvproto simulate --secondary
redis:url=redis://127.0.0.1:PORT/0`` works as written (the URL keeps its ``:``), and ``kvproto.hosting``
builds the same plain RedisTier from the same options, text values typed by the factory's annotations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from redis import Redis

from kvproto import MemoryPrimaryTier
from kvproto.hosting import build_secondary_tier

from tests.cli import kvproto_cli

if TYPE_CHECKING:
    from kvproto_redis import LocalRedis


def test_simulate_takes_a_redis_url_as_written(redis_server: LocalRedis, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    code = kvproto_cli(["simulate", "--secondary", f"redis:url={url},prefix=sim-url", "--steps", "300",
                        "--step-ms", "1", "--strict", "--json", str(report)])
    data = json.loads(report.read_text())
    assert code == 0, (data["problems"], data["warnings"])
    assert data["config"]["tier_options"]["redis"] == {"url": url, "prefix": "sim-url"}
    assert data["config"]["unsized"] == ["redis"]  # the server's maxmemory bounds it, not the simulator
    assert data["wrong_bytes"] == 0 and data["tiers"]["redis"]["stored_blocks"] > 0
    client = Redis(host="127.0.0.1", port=redis_server.port)
    try:
        assert client.keys("sim-url:*")  # the blocks went where the options said
        client.delete(*client.keys("sim-url:*"))
    finally:
        client.close()


def test_hosting_builds_a_plain_redis_tier_from_text_options(redis_server: LocalRedis) -> None:
    primary = MemoryPrimaryTier(num_slots=8, block_bytes=64)
    tier = build_secondary_tier("redis", primary.buffer, {"url": f"redis://127.0.0.1:{redis_server.port}/0",
                                                         "prefix": "123", "read_threads": "2"})
    try:
        assert type(tier).__name__ == "RedisTier"  # the tier an engine runs, not the kit's fixture
        config = getattr(tier, "config")  # noqa: B009 - RedisTier's own attribute, read without importing it
        assert config.prefix == "123" and config.read_threads == 2  # "123" stays text; "2" becomes an int
    finally:
        tier.shutdown()


def test_conform_without_a_server_to_use_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ``KVPROTO_REDIS_URL`` and no ``redis-server`` to start: the tier is unavailable (skipped when
    ``kvproto conform`` runs every reference tier; a usage error when named), never a failed verdict."""
    import shutil

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "redis-server" else real(name, *a, **k))
    monkeypatch.delenv("KVPROTO_REDIS_URL", raising=False)
    assert kvproto_cli(["conform", "redis", "--no-typecheck"]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("kvproto conform: tier 'redis' needs a Redis server") and len(out.splitlines()) == 1, out
