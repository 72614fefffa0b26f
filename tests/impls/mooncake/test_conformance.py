"""MooncakeTier passes the conformance kit against a real master and storage process on loopback, through
its test class and through ``kvproto conform mooncake``, and the kit leaves no key behind (MC-10)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kvproto import SecondaryTier

from tests.cli import kvproto_cli as main
from tests.impls._conform_child import conform_remote_tier_in_a_child
from tests.impls._kit_hooks import HookTableTests
from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    import kvproto_mooncake as mc
    from kvproto_mooncake import KitRun, LocalMooncake
    from kvproto_mooncake._conformance import KIT_PREFIX


@pytest.fixture(scope="module")
def kit_run(mooncake_cluster: LocalMooncake) -> Iterator[KitRun]:
    """The module's kit run on the session's cluster; its keys removed at the end, and checked gone."""
    run = KitRun(mooncake_cluster.config(), admin_url=mooncake_cluster.admin_url)
    yield run
    run.clean_up()
    assert run.keys() == []


class TestMooncakeTier(HookTableTests):
    """Every kit check through the distribution's hooks (MOONCAKE_HOOKS, and the run's ``reopen``,
    ``reopen_other_layout``, ``start_down`` and ``storage_names``): each tier a ``faulty_jobs(MooncakeTier)``
    over a fresh key prefix of the module's run."""

    kit_profile = "fast"
    HOOKS = mc.MOONCAKE_HOOKS if MOONCAKE_MISSING is None else {}
    TABLE_HOOKS = ("reopen_other_layout", "start_down", "fail_io", "storage_requests", "grow_storage", "request_plan",
                   "expected_abilities", "storage_names", "namespace_of", "reopen_with_layout")
    run_hooks: Mapping[str, Callable[..., Any]]

    def _hook(self, name: str, *args: Any) -> Any:
        return self.run_hooks.get(name, self.HOOKS.get(name, _no_hook(name)))(*args)

    @pytest.fixture
    def tier_factory(self, kit_run: KitRun) -> Callable[[memoryview], SecondaryTier]:
        spec = mc.mooncake_spec(run=kit_run)
        self.run_hooks = spec.hooks  # the run's reopen builds over the run's storage
        factory: Callable[[memoryview], SecondaryTier] = spec.factory
        return factory


def _no_hook(name: str) -> Callable[..., Any]:
    def missing(*args: Any) -> Any:
        raise NotImplementedError(name)

    return missing


def _kit_keys(cluster: LocalMooncake) -> list[str]:
    return [k for k in cluster.keys() if k.startswith(f"{KIT_PREFIX}/")]


def test_conform_mooncake_passes_and_leaves_no_key(mooncake_cluster: LocalMooncake, tmp_path: Path) -> None:
    """`kvproto conform mooncake` in a process of its own, pointed at the session's cluster by the environment
    (MC-10): every check passes or is skipped for what the tier does not declare or offer, and when the process
    has ended the master holds none of the kit's keys."""
    before = _kit_keys(mooncake_cluster)
    outcomes, skipped = conform_remote_tier_in_a_child("mooncake", tmp_path / "r.json")
    assert all(r.startswith(("needs ", "vacuous: ")) for r in skipped.values()), skipped
    for check in ("test_sharing_between_instances", "test_persistence_across_instances",
                  "test_io_errors_inside_transfers_fail_cleanly", "test_a_constructor_refuses_storage_that_is_down",
                  "test_a_tier_writes_only_under_its_own_namespace",
                  "test_existence_batches_keep_the_declared_request_plan"):
        assert outcomes[check] == "passed", (check, skipped.get(check))
    assert set(_kit_keys(mooncake_cluster)) <= set(before)  # the run's own keys are gone (the module's run: at its end)


def test_an_unreachable_cluster_is_unavailable_never_passed(mooncake_cluster: LocalMooncake,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With KVPROTO_MOONCAKE_MASTER naming a port nobody listens on, the spec is TierUnavailable (MC-10):
    `kvproto conform mooncake` exits 2 saying so, and `kvproto conform` with no target skips the tier."""
    from kvproto.hosting import TierUnavailable

    from kvproto_mooncake._local_server import _free_port

    monkeypatch.setenv("KVPROTO_MOONCAKE_MASTER", f"127.0.0.1:{_free_port()}")
    with pytest.raises(TierUnavailable, match="does not answer"):
        mc.conformance_spec()
    assert main(["conform", "mooncake", "--profile", "fast"]) == 2
