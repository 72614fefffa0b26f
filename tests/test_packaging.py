"""Each distribution installs exactly its own package, as a user gets it from the built wheel.

The wheels are built here from the checkout (no build isolation: offline, with the setuptools of
this environment); CI additionally installs the kvproto wheel into a fresh venv and runs the CLI
there (``.ci/wheels``).
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: distribution folder -> (its wheel's name, up to the version; the one top-level package; its tiers)
DISTRIBUTIONS = {
    ".": ("kvproto", "kvproto", {"memory", "memory-async", "memory-threaded", "memory-primary"}),
    "impls/cpu": ("kvproto_cpu", "kvproto_cpu", {"cpu"}),
    "impls/fs": ("kvproto_fs", "kvproto_fs", {"fs"}),
    "impls/mooncake": ("kvproto_mooncake", "kvproto_mooncake", {"mooncake"}),
    "impls/obj": ("kvproto_obj", "kvproto_obj", {"obj"}),
    "impls/redis": ("kvproto_redis", "kvproto_redis", {"redis", "redis-cluster"}),
    "adapters/vllm": (
        "kvproto_vllm", "kvproto_vllm", {"vllm-example", "vllm-fs", "vllm-fs-direct", "vllm-cpu", "vllm-cpu-arc"}
    ),
    "adapters/lmcache": ("kvproto_lmcache", "kvproto_lmcache", {"lmcache-fs", "lmcache-mock"}),
    "adapters/sglang": ("kvproto_sglang", "kvproto_sglang", {"sglang-file"}),
}

#: Distributions whose tiers are not reference tiers (no kvproto-reference keyword, KIT-9).
NOT_REFERENCE = {"adapters/vllm", "adapters/lmcache", "adapters/sglang"}

#: The engine adapters' ``kvproto conform ENGINE:MODULE:CLASS`` handlers (entry-point group kvproto.target_schemes).
SCHEMES = {"adapters/vllm": {"vllm"}, "adapters/lmcache": {"lmcache"}, "adapters/sglang": {"sglang"}}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
         *(str(ROOT / d) for d in DISTRIBUTIONS)],
        check=True, capture_output=True, text=True,
    )
    built = {w.name.split("-", 1)[0]: w for w in out.glob("*.whl")}
    assert len(built) == len(DISTRIBUTIONS), sorted(built)
    return {folder: built[wheel_name] for folder, (wheel_name, _, _) in DISTRIBUTIONS.items()}


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {name.split("/", 1)[0] for name in zf.namelist() if ".dist-info/" not in name}


def _entry_points(wheel: Path) -> configparser.ConfigParser:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep entry-point names' case
        parser.read_string(zf.read(name).decode())
        return parser


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(name).decode()


@pytest.mark.parametrize("folder", sorted(DISTRIBUTIONS))
def test_wheel_installs_exactly_its_own_package(wheels: dict[str, Path], folder: str) -> None:
    """kvproto installs `kvproto` alone (no spec/, impls/ or benchmarks/ to shadow a user's folders)."""
    _, package, _ = DISTRIBUTIONS[folder]
    assert _top_level(wheels[folder]) == {package}
    with zipfile.ZipFile(wheels[folder]) as zf:
        assert f"{package}/py.typed" in zf.namelist()


@pytest.mark.parametrize("folder", sorted(DISTRIBUTIONS))
def test_wheel_registers_its_tiers_as_reference(wheels: dict[str, Path], folder: str) -> None:
    _, _, tiers = DISTRIBUTIONS[folder]
    assert set(_entry_points(wheels[folder])["kvproto.tiers"]) == tiers
    keywords = [line for line in _metadata(wheels[folder]).splitlines() if line.startswith("Keywords:")]
    if folder in NOT_REFERENCE:
        assert not keywords or "kvproto-reference" not in keywords[0]
    else:
        assert keywords and "kvproto-reference" in keywords[0]


def test_kvproto_wheel_needs_no_torch_and_no_pydantic(wheels: dict[str, Path]) -> None:
    requires = [line for line in _metadata(wheels["."]).splitlines() if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert not [r for r in requires if "torch" in r or "pydantic" in r]
    assert any(r.startswith("Requires-Dist: rich") for r in base)
    cpu = [line for line in _metadata(wheels["impls/cpu"]).splitlines() if line.startswith("Requires-Dist:")]
    assert any("torch" in r for r in cpu) and any(r.startswith("Requires-Dist: kvproto") for r in cpu)


def test_kvproto_mooncake_needs_mooncakes_wheel_from_pypi(wheels: dict[str, Path]) -> None:
    """kvproto-mooncake's one third-party dependency beyond pydantic and xxhash is Mooncake's own wheel (its
    client and servers), on the platform that wheel exists for."""
    requires = [line for line in _metadata(wheels["impls/mooncake"]).splitlines() if line.startswith("Requires-Dist:")]
    (mooncake,) = [r for r in requires if "mooncake" in r]
    assert mooncake.startswith("Requires-Dist: mooncake-transfer-engine-non-cuda") and "platform_machine" in mooncake


@pytest.mark.parametrize("folder", sorted(DISTRIBUTIONS))
def test_only_kvproto_cpu_carries_compiled_code(wheels: dict[str, Path], folder: str) -> None:
    """kvproto-cpu's copy kernel (CPU-13) is its one compiled module, built for the stable ABI (one wheel for
    CPython 3.11 and later), with its stub for mypy and without its C source; every other wheel is pure."""
    with zipfile.ZipFile(wheels[folder]) as zf:
        names = set(zf.namelist())
    compiled = sorted(n for n in names if n.endswith((".so", ".pyd")))
    if folder != "impls/cpu":
        assert not compiled and wheels[folder].name.endswith("-py3-none-any.whl")
        return
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: setup.py leaves the optional extension out")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers here: setup.py leaves the optional extension out")
    assert compiled == ["kvproto_cpu/_streamcopy.abi3.so"] and "-cp311-abi3-" in wheels[folder].name
    assert "kvproto_cpu/_streamcopy.pyi" in names and not [n for n in names if n.endswith(".c")]


def test_kvproto_wheel_ships_what_verify_needs(wheels: dict[str, Path]) -> None:
    """`kvproto verify` works from the wheel: the reference scans, checks and CrossHair targets are inside."""
    with zipfile.ZipFile(wheels["."]) as zf:
        names = set(zf.namelist())
    for module in ("_reference", "_checks", "_crosshair_targets", "_crosshair_stats", "_properties", "_inputs", "_targets"):
        assert f"kvproto/_verification/{module}.py" in names


def test_kvproto_wheel_ships_the_sample_trace(wheels: dict[str, Path]) -> None:
    """`kvproto simulate --trace sample` works from the wheel: the generated trace is inside (MGR-22)."""
    with zipfile.ZipFile(wheels["."]) as zf:
        shipped = zf.read("kvproto/_simulation/data/sample_trace.jsonl")
    assert shipped == (ROOT / "kvproto" / "_simulation" / "data" / "sample_trace.jsonl").read_bytes()


@pytest.mark.parametrize("folder", sorted(SCHEMES))
def test_engine_adapters_register_their_target_scheme(wheels: dict[str, Path], folder: str) -> None:
    """``kvproto conform vllm:MODULE:CLASS`` / ``lmcache:MODULE:CLASS`` / ``sglang:MODULE:CLASS`` resolve through these."""
    assert set(_entry_points(wheels[folder])["kvproto.target_schemes"]) == SCHEMES[folder]
