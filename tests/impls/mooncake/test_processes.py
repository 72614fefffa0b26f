"""Blocks live in the storage process, not in the writer (MC-8): a writer process stores blocks and exits, and
readers in other processes, at once, see and load every one of them with the right bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake

ROOT = Path(__file__).resolve().parents[3]
BLOCKS = 24


def _spawn(role: str, prefix: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "tests.impls.mooncake._processes", role, prefix, str(BLOCKS)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(process: subprocess.Popen[str]) -> dict[str, object]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    answer: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return answer


def test_a_writer_that_exits_leaves_its_blocks_to_readers_in_other_processes(
    mooncake_cluster: LocalMooncake, prefix: str
) -> None:
    """The writer's client contributes no segment (segment_bytes=0): its blocks are in mooncake_client's memory,
    so after the writer has exited two reader processes each find all of them (HIT) and load them with the right
    bytes, none wrong."""
    assert _answer(_spawn("write", prefix)) == {"stored": BLOCKS}
    readers = [_spawn("read", prefix) for _ in range(2)]
    for reader in readers:
        assert _answer(reader) == {"hits": BLOCKS, "right": BLOCKS, "wrong": 0, "success": True}
