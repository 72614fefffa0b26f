"""TIERKIT-12: ``SharedStoreTier`` builds a BlobTier over shared storage from a tier's settings (the start-up check,
its backend released when construction fails, the declared capabilities, the storage's names), and
``RemoteStoreTierSettings`` / ``TierSettings.text_fields`` are the settings such a tier shares. Over a real
:class:`MemoryBackend`, no server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from kvproto import tierkit
from kvproto.errors import ConfigurationError
from kvproto.tierkit import BlobTierStats, MemoryBackend, RemoteStoreTierSettings, SharedStoreTier

from tests.impls._tier_runner import Runner, key, make_buffer, shut_down_after


class Settings(RemoteStoreTierSettings):
    """A remote store's settings: a path and a secret may come as text."""

    text_fields = {"root": Path, "token": SecretStr}
    root: Path | None = None
    token: SecretStr | None = None

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)


class PrefixedTier(SharedStoreTier):
    """A tier whose storage names each blob ``p:<name>``; it records its start-up checks."""

    def __init__(self, buffer: memoryview, settings: Settings, backend: MemoryBackend, *, fail: bool = False) -> None:
        self.checks: list[str] = []
        self.released = 0

        def check() -> None:
            with tierkit.storage_check("PrefixedTier 'p'", "write the manifest"):
                self.checks.append("check")
                if fail:
                    raise OSError("the storage is down")

        def release() -> None:
            self.released += 1

        super().__init__(backend, buffer, settings, name="p", stats=BlobTierStats(), wrap=None, read_threads=2,
                         write_threads=2, op_timeout_s=5.0, persistent=False, check=check, release=release,
                         reasons={"async_lookup": "RETRY while asked", "eviction": "never on its own",
                                  "persistence": "a test's memory"})

    def storage_name(self, name: str) -> str:
        return f"p:{name}"


def test_the_check_runs_first_and_a_failed_construction_releases_the_backend() -> None:
    buffer = make_buffer()
    tier = PrefixedTier(buffer, Settings(), MemoryBackend())
    with shut_down_after((tier, Runner(tier, buffer))):
        assert tier.checks == ["check"] and tier.released == 0
    unchecked = PrefixedTier(buffer, Settings(check_on_start=False), MemoryBackend())
    with shut_down_after((unchecked, Runner(unchecked, buffer))):
        assert unchecked.checks == []
    released: list[PrefixedTier] = []

    class Recorded(PrefixedTier):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            released.append(self)
            super().__init__(*args, **kwargs)

    with pytest.raises(ConfigurationError, match="PrefixedTier 'p': cannot write the manifest: OSError: the storage is down"):
        Recorded(make_buffer(), Settings(), MemoryBackend(), fail=True)
    with pytest.raises(ConfigurationError):  # the engine refuses the buffer: the backend is released too
        Recorded(memoryview(bytearray(8)), Settings(check_on_start=False), MemoryBackend())
    assert [t.released for t in released] == [1, 1]


def test_it_declares_a_shared_store_and_names_blobs_as_its_storage_does() -> None:
    buffer = make_buffer()
    tier = PrefixedTier(buffer, Settings(probe_deadline_steps=5), MemoryBackend())
    with shut_down_after((tier, Runner(tier, buffer))) as (_, run):
        caps = tier.capabilities
        assert caps.sharing and caps.async_lookup and caps.partial_jobs and not caps.eviction and not caps.persistence
        assert caps.max_retry_steps == 5 and caps.reasons["persistence"] == "a test's memory"
        assert tier.reset_needs_storage
        k = key(1, b"shared")
        assert run.store([k]).success
        assert tier.known_keys() == frozenset({k})
        assert tier.key_of(k) == f"p:{tier.name_of(k)}"
        assert tier.namespace_prefix == f"p:{tier.namespace.hex()}/" and tier.key_of(k).startswith(tier.namespace_prefix)


def test_remote_settings_take_text_for_typed_fields_and_refuse_a_shrinking_backoff(tmp_path: Path) -> None:
    settings = Settings(root=str(tmp_path), token="hunter2", connect_timeout_s=2)
    assert settings.root == tmp_path and isinstance(settings.token, SecretStr) and "hunter2" not in repr(settings)
    assert (settings.connect_timeout_s, settings.init_backoff_s, settings.max_backoff_s) == (2.0, 0.05, 0.5)
    with pytest.raises(ConfigurationError, match="invalid Settings: .*init_backoff_s must not exceed max_backoff_s"):
        Settings(init_backoff_s=1.0, max_backoff_s=0.5)
    with pytest.raises(ConfigurationError, match="connect_timeout_s"):
        Settings(connect_timeout_s=float("inf"))
    with pytest.raises(ConfigurationError, match="root"):
        Settings(root=3)  # only text becomes a path
