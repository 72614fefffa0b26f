"""SGLang's storage backends through the kit (SGL-8): ``kvproto conform sglang-file`` names the
flipped-byte defect of SGLang's ``HiCacheFile`` on its clause, a correct ``HiCacheStorage`` written
outside kvproto conforms with no options on both data paths, and each finding has its regression
test on ``HiCacheFile`` itself, through the calls SGLang's controller makes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile

from kvproto_sglang._as_kvproto import SlotHostPool
from kvproto_sglang._conformance import storage_config
from kvproto_sglang.testing import SglangStorageTests
from tests.adapters.kit_reports import conform_report

DICT_STORAGE = "sglang:tests.adapters.sglang.sglang_backends:DictStorage"
#: What the kit finds in HiCacheFile and the clause each violates, judged in docs/kvproto-and-sglang.md:
#: no checksum, so a flipped byte loads as success.
FILE_FINDINGS = {"test_corrupt_block_fails_load": "TIER-10", "test_no_cached_hit_after_a_damaged_load": "TIER-10"}


def test_sglang_file_fails_exactly_on_the_flipped_byte_and_names_its_clause(tmp_path: Path) -> None:
    code, checks = conform_report(tmp_path / "report.json", "sglang-file")
    failed = {name: c["violated_clause"] for name, c in checks.items() if c["outcome"] == "failed"}
    assert code == 1
    assert failed == FILE_FINDINGS
    for name in FILE_FINDINGS:
        assert "one wrong byte" in checks[name]["reason"], checks[name]
    assert checks["test_events_report_removals"]["outcome"] == "xfailed"


LAYER_FIRST_BF16 = ["--option", "host_pool.layout=layer_first", "--option", "host_pool.dtype=bfloat16"]


@pytest.mark.parametrize("option", [[], ["--option", "interface_v1=1"], LAYER_FIRST_BF16,
                                    ["--option", "interface_v1=1", *LAYER_FIRST_BF16]],
                         ids=["no-options", "interface_v1", "layer_first-bf16", "interface_v1-layer_first-bf16"])
def test_a_correct_sglang_backend_written_outside_kvproto_conforms(tmp_path: Path, option: list[str]) -> None:
    """With no options, and with a ``layer_first`` bfloat16 host pool on both data paths."""
    code, checks = conform_report(tmp_path / "report.json", DICT_STORAGE, *option)
    assert [n for n, c in checks.items() if c["outcome"] == "failed"] == []
    assert code == 0


def test_a_layer_first_host_pool_scatters_each_page_and_gives_it_back_whole() -> None:
    """The kit's ``layer_first`` pool is laid out as SGLang's: a page's bytes are not one row of its buffer."""
    raw = bytearray(range(256)) * 2
    buffer = memoryview(raw).cast("B", [8, 64])
    row = [bytes(raw[s * 64 : (s + 1) * 64]) for s in range(8)]
    pool = SlotHostPool(buffer, torch.bfloat16, "layer_first")
    pool.from_rows(range(8))
    assert bytes(pool.kv_buffer.view(torch.uint8).reshape(-1)[:64].numpy()) != row[0]
    for slot in range(8):
        assert bytes(pool.get_data_page(slot).view(torch.uint8).numpy()) == row[slot]
    pool.rows.zero_()
    pool.to_rows(range(8))
    assert bytes(raw) == b"".join(row)


def _file_backend(root: Path) -> tuple[HiCacheFile, Path]:
    backend = HiCacheFile(storage_config({"file_storage_path": str(root)}))
    return backend, root / f"{'ab' * 32}{backend.config_suffix}.bin"


def test_hicache_file_loads_a_flipped_byte_as_success(tmp_path: Path) -> None:
    """Defect (no checksum): the page read back differs from the page stored, and SGLang is told it loaded."""
    backend, path = _file_backend(tmp_path)
    page = torch.arange(64, dtype=torch.uint8)
    assert backend.batch_set(["ab" * 32], [page]) is True
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), bytes([int(page[0].item()) ^ 0xFF]), 0)
    (loaded,) = backend.batch_get(["ab" * 32], [torch.zeros(64, dtype=torch.uint8)])
    assert loaded is not None and not torch.equal(loaded, page)


def test_hicache_file_says_a_truncated_page_exists_then_raises_on_reading_it(tmp_path: Path) -> None:
    """Defect: ``batch_exists`` counts a truncated file, ``batch_get`` raises (SGLang's transfer then
    swallows it as 0 pages: the request recomputes, after paying for the query)."""
    backend, path = _file_backend(tmp_path)
    assert backend.batch_set(["ab" * 32], [torch.arange(64, dtype=torch.uint8)]) is True
    path.write_bytes(path.read_bytes()[:10])
    assert backend.batch_exists(["ab" * 32]) == 1
    with pytest.raises(OSError, match="Short read"):
        backend.batch_get(["ab" * 32], [torch.zeros(64, dtype=torch.uint8)])


def test_hicache_file_loads_a_too_long_page_as_success(tmp_path: Path) -> None:
    """Defect: a file longer than the page loads its first bytes as success (no length check)."""
    backend, path = _file_backend(tmp_path)
    page = torch.arange(64, dtype=torch.uint8)
    assert backend.batch_set(["ab" * 32], [page]) is True
    path.write_bytes(path.read_bytes() + b"tail")
    (loaded,) = backend.batch_get(["ab" * 32], [torch.zeros(64, dtype=torch.uint8)])
    assert loaded is not None and torch.equal(loaded, page)


class TestDictStorageInTheAuthorsSuite(SglangStorageTests):
    """SGL-8: the kit's checks in a backend author's own pytest suite, over the v1 calls."""

    sglang_storage = "tests.adapters.sglang.sglang_backends:DictStorage"
    sglang_options = {"interface_v1": 1}
