"""``fs`` as an engine hosts it by name (``kvproto.hosting.build_secondary_tier``): a plain FsTier
configured by the options, not the tier the kit checks (KIT-9, FS-1)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from kvproto.errors import ConfigurationError
from kvproto.hosting import build_secondary_tier

from kvproto_fs import FsTier, conformance_spec
from tests.impls._tier_runner import Runner, key, make_buffer, shut_down_after


def test_hosting_fs_with_options_builds_an_fs_tier_of_that_configuration(tmp_path: Path) -> None:
    buffer = make_buffer()
    tier = build_secondary_tier("fs", buffer, {"root": str(tmp_path), "max_bytes": 1 << 30, "write_threads": 2})
    with shut_down_after((tier, Runner(tier, buffer))) as (built, runner):
        assert type(built) is FsTier
        assert (built.root, built.config.max_bytes, built.config.write_threads, built.config.shared) == (
            tmp_path, 1 << 30, 2, False)
        stored = key(1)
        assert runner.store([stored]).success
        assert runner.resolve([stored]) == {stored: "HIT"}
        _, right, wrong = runner.load([stored])
        assert right == {stored} and not wrong


def test_hosting_fs_with_default_options_has_no_budget_and_a_temporary_root() -> None:
    """No ``root``: a fresh temporary directory; no ``max_bytes``: nothing is evicted. The kit's
    ``fs`` (the spec's factory) keeps its 48-block budget, so ``kvproto conform fs`` is unchanged."""
    buffer = make_buffer()
    tier = build_secondary_tier("fs", buffer)
    with shut_down_after((tier, Runner(tier, buffer))) as (built, _):
        assert type(built) is FsTier and built.config.max_bytes is None and not built.config.shared
        assert built.root.is_dir() and built.root.name.startswith("kvproto-fs-hosted-")
    kit = conformance_spec().factory(make_buffer())
    try:
        assert type(kit) is not FsTier and kit.config.max_bytes is not None and kit.config.shared
    finally:
        kit.shutdown()


def test_a_temporary_root_is_removed_once_its_tier_is_gone() -> None:
    """Without a ``root``, the fresh temporary directory goes with the tier (shut down and dropped), not
    only at exit: a process that ends by ``os._exit`` (pytest-xdist's workers) runs no exit handlers, and
    every run left its blocks behind."""
    buffer = make_buffer()
    tier = build_secondary_tier("fs", buffer)
    assert isinstance(tier, FsTier)
    root = tier.root
    with shut_down_after((tier, Runner(tier, buffer))) as (built, runner):
        assert runner.store([key(7)]).success
    assert any(root.rglob("*.kvb"))
    del tier, built, runner
    gc.collect()
    assert not root.exists()


def test_hosting_fs_with_a_bad_option_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no_such_option"):
        build_secondary_tier("fs", make_buffer(), {"root": str(tmp_path), "no_such_option": 1})
    with pytest.raises(ConfigurationError, match="does not exist"):
        build_secondary_tier("fs", make_buffer(), {"root": str(tmp_path / "missing")})
