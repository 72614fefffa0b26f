"""Hosting a registered kvproto tier in an engine needs no test framework (KIT-9, VLLM-2, LMC-1, SGL-1).

Each check runs in a fresh interpreter with pytest and Hypothesis made unimportable
(``sys.modules[name] = None``): the adapters' hosting paths (kvproto-vllm's ``build_kvproto_tier``,
the function ``KvprotoTier`` builds its tier with; kvproto-lmcache's ``KvprotoL2Adapter`` under
LMCache's own ``basic_check``; kvproto-sglang's ``KvprotoHiCacheStorage`` as SGLang's dynamic
backend factory builds it) build ``memory`` and ``fs`` by name through :mod:`kvproto.hosting`
and round-trip blocks through them. Importing the hosting modules loads no part of the kit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = "import sys\nsys.modules['pytest'] = None\nsys.modules['hypothesis'] = None\n"

#: A store, then a load into zeroed rows, through the tier vLLM's KvprotoTier would host.
VLLM_ROUND_TRIP = BLOCKED + """
import kvproto.hosting, kvproto_vllm, kvproto_lmcache
assert not any(m == 'kvproto.testing' or m.startswith('kvproto.testing.') for m in sys.modules), 'the kit loaded'
import hashlib, time
from kvproto import LookupResult, ReqContext, TransferJob, make_key
from kvproto_vllm import as_slot_buffer, build_kvproto_tier

name = sys.argv[1]
view = memoryview(bytearray(4 * 64)).cast('b', (4, 64))  # vLLM's primary view: int8 rows
buffer = as_slot_buffer(view)
flat = buffer.cast('B')
tier = build_kvproto_tier(name, buffer)
keys = tuple(make_key(hashlib.sha256(bytes([i])).digest()[:16], 0) for i in range(4))
rows = lambda: [bytes(flat[slot * 64 : (slot + 1) * 64]) for slot in range(4)]
flat[:] = b''.join(hashlib.shake_256(bytes([slot])).digest(64) for slot in range(4))
want = rows()

def settle(job_id):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done = [r for r in tier.get_finished_jobs() if r.job_id == job_id]
        if done:
            return done[0]
        tier.on_step_end()
        time.sleep(0.001)
    raise AssertionError('job never finished')

ctx = ReqContext(req_id='r')
tier.submit_store(TransferJob(1, keys, (0, 1, 2, 3), False))
assert settle(1).success
flat[:] = bytes(4 * 64)
deadline = time.monotonic() + 20
while any(tier.lookup(k, ctx) is not LookupResult.HIT for k in keys):
    assert time.monotonic() < deadline, 'never a HIT'
    tier.on_step_end()
tier.submit_load(TransferJob(2, keys, (0, 1, 2, 3), True))
assert settle(2).success
assert rows() == want and want != [bytes(64)] * 4
tier.shutdown()
print('round trip ok', type(tier).__name__)
"""

#: LMCache's own check of an L2 adapter (absent keys, store, lookup, load, content), run as its users run it.
LMCACHE_CHECK = BLOCKED + """
import json, runpy
name = sys.argv[1]
spec = {"type": "plugin", "module_path": "kvproto_lmcache", "class_name": "KvprotoL2Adapter",
        "adapter_params": {"tier": name}}
sys.argv = ['basic_check', '--mode', 'test_l2_adapter', '--l2-adapter', json.dumps(spec)]
runpy.run_module('lmcache.v1.basic_check', run_name='__main__')
"""

#: SGLang's backend factory builds KvprotoHiCacheStorage from the dynamic extra config; a page set, found, read back.
SGLANG_ROUND_TRIP = BLOCKED + """
import tempfile, torch
import kvproto.hosting, kvproto_sglang
assert not any(m == 'kvproto.testing' or m.startswith('kvproto.testing.') for m in sys.modules), 'the kit loaded'
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

name = sys.argv[1]
options = {"root": tempfile.mkdtemp()} if name == "fs" else {}
extra = {"backend_name": "kvproto", "module_path": "kvproto_sglang", "class_name": "KvprotoHiCacheStorage",
         "tier": name, "options": options}
config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                              is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                              model_name="m", extra_config=extra)
backend = StorageBackendFactory.create_backend("dynamic", config, None)
pages = [torch.randint(0, 256, (64,), dtype=torch.uint8) for _ in range(4)]
keys = [f"{i:064x}" for i in range(4)]
assert backend.batch_set(keys, pages)
assert backend.batch_exists(keys) == 4
got = backend.batch_get(keys, [torch.zeros(64, dtype=torch.uint8) for _ in keys])
assert all(g is not None and torch.equal(g, p) for g, p in zip(got, pages))
backend.close()
print('round trip ok', type(backend).__name__)
"""


def _run(script: str, tier: str) -> str:
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    got = subprocess.run([sys.executable, "-c", script, tier], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env, check=False)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    return got.stdout


@pytest.mark.parametrize("tier", ["memory", "fs"])
def test_vllms_hosting_path_builds_a_registered_tier_without_pytest_or_hypothesis(tier: str) -> None:
    assert "round trip ok" in _run(VLLM_ROUND_TRIP, tier)


@pytest.mark.parametrize("tier", ["memory", "fs"])
def test_lmcaches_adapter_hosts_a_registered_tier_without_pytest_or_hypothesis(tier: str) -> None:
    out = _run(LMCACHE_CHECK, tier)
    for line in ("Batch store OK", "Validation: 5/5 found", "Validation (content): 5/5"):
        assert line in out, out


@pytest.mark.parametrize("tier", ["memory", "fs"])
def test_sglangs_dynamic_backend_hosts_a_registered_tier_without_pytest_or_hypothesis(tier: str) -> None:
    assert "round trip ok" in _run(SGLANG_ROUND_TRIP, tier)
