"""Every snippet of docs/one-tier-every-engine.md, run: the factory module written as the page shows
it, the commands through the kvproto command line (one kit check each, to stay quick), the vLLM
configuration in vLLM's own manager, the LMCache configuration through LMCache's basic_check, the
SGLang configuration through SGLang's backend factory and its controller's storage paths."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.vllm import vllm_support

vllm_support.install()
os.environ["LMCACHE_TRACK_USAGE"] = "false"

from tests.adapters.lmcache.test_kvproto_tiers_in_lmcache import basic_check  # noqa: E402
from tests.adapters.vllm.test_kvproto_tiers_in_vllm import Engine, block, run_scenario  # noqa: E402
from tests.cli import kvproto_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "one-tier-every-engine.md"


def snippets() -> dict[str, str]:
    """Each ``<!-- snippet: NAME -->`` marker's following code block, by name."""
    found = re.findall(r"<!-- snippet: ([\w-]+) -->\n```\w*\n(.*?)```", PAGE.read_text(), flags=re.S)
    return {name: text.strip() for name, text in found}


SNIPPETS = snippets()


def test_the_page_has_every_snippet_this_file_runs() -> None:
    assert set(SNIPPETS) == {
        "factory", "conform", "vllm", "lmcache", "lmcache-check", "sglang", "conform-vllm", "conform-lmcache",
        "vllm-pytest",
    }


@pytest.fixture
def my_tiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The page's ``my_tiers.py``, importable (as the page's reader has it on their path)."""
    (tmp_path / "my_tiers.py").write_text(SNIPPETS["factory"] + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))
    yield tmp_path
    sys.modules.pop("my_tiers", None)


def _with_root(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """The page's configuration with its ``/nvme/kv`` root moved under the test's directory (made,
    as the reader's is)."""
    root.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config).replace("/nvme/kv", str(root))
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _cli(command: str, *extra: str) -> int:
    argv = shlex.split(command)
    while argv and "=" in argv[0] and not argv[0].startswith("-"):  # leading VAR=value assignments
        argv.pop(0)
    assert argv[0] == "kvproto", command
    return kvproto_cli([*argv[1:], *extra])


@pytest.mark.parametrize(("name", "check", "code"), [
    ("conform", "hit_after_successful_store", 0),
    ("conform-vllm", "retry_resolves_within_declared_steps", 0),
    ("conform-lmcache", "load_copies_stored_bytes_into_requested_slots", 0),
])
def test_the_conform_commands_run_the_kit(name: str, check: str, code: int) -> None:
    assert _cli(SNIPPETS[name], "--no-typecheck", "--profile", "fast", "--check", check) == code


def test_the_vllm_configuration_runs_in_vllms_manager(my_tiers: Path) -> None:
    config = _with_root(json.loads(SNIPPETS["vllm"]), my_tiers / "kv")
    engine = Engine(config)
    try:
        wanted, got, _ = run_scenario(engine)
    finally:
        engine.close()
    assert got == [block(k) for k in wanted]
    assert any((my_tiers / "kv").rglob("*")), "the blocks should lie under the configured root"


def test_the_lmcache_configuration_passes_lmcaches_basic_check(my_tiers: Path) -> None:
    spec = json.dumps(_with_root(json.loads(SNIPPETS["lmcache"]), my_tiers / "kv"))
    out = basic_check(spec)
    assert "Validation (content): 5/5" in out and "FAIL" not in out, out


def test_the_sglang_configuration_round_trips_through_sglangs_controller(my_tiers: Path) -> None:
    """SGL-1: SGLang's factory builds the page's backend, and its backup and prefetch paths move pages byte-exact."""
    from tests.adapters.sglang.sglang_controller import HostPool, StorageController, storage_config

    config = _with_root(json.loads(SNIPPETS["sglang"]), my_tiers / "kv")
    pool = HostPool(pages=16)
    pool.fill_random(seed=9)
    controller = StorageController("dynamic", storage_config(config), pool)
    try:
        tokens = list(range(8 * pool.page_size))
        assert controller.backup(tokens, first_page=0) == len(tokens)
        assert controller.prefetch("page", tokens, first_page=8) == (len(tokens), 8)
        assert [pool.page_bytes(8 + p) for p in range(8)] == [pool.page_bytes(p) for p in range(8)]
    finally:
        controller.close()
    assert list((my_tiers / "kv").iterdir())  # the fs tier's blocks are under the configured root


def test_the_lmcache_check_command_passes() -> None:
    argv = shlex.split(SNIPPETS["lmcache-check"])
    assert argv[0] == "LMCACHE_TRACK_USAGE=false" and argv[1:4] == ["python", "-m", "lmcache.v1.basic_check"]
    got = subprocess.run(
        [sys.executable, *argv[2:]], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "LMCACHE_TRACK_USAGE": "false"},
    )
    assert got.returncode == 0 and "Validation (content): 5/5" in got.stdout and "FAIL" not in got.stdout, got.stdout


def test_the_pytest_snippet_collects_the_kit(tmp_path: Path) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(SNIPPETS["vllm-pytest"], "docs/one-tier-every-engine.md", "exec"), namespace)  # the page's code
    cls = namespace["TestMyVllmTier"]
    assert "test_hit_after_successful_store" in dir(cls)
    assert set(cls.expected_failures) >= {"test_reset_cache_forgets_blocks"}
