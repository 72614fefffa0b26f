"""The option contract of ``kvproto.hosting`` (``parse_tier_arg``, ``typed_options``; KIT-9, issue 38):
``NAME:opt=value,...`` read as written (values holding ``:`` and ``=``), each text value converted by the factory's annotation, an
error naming the option otherwise; and ``kvproto simulate`` using it end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest

from kvproto.hosting import TierOptionError, parse_tier_arg, typed_options

from tests.cli import kvproto_cli


@pytest.mark.parametrize(
    ("text", "name", "options"),
    [
        ("redis", "redis", {}),
        ("redis:url=redis://127.0.0.1:6379/0", "redis", {"url": "redis://127.0.0.1:6379/0"}),
        ("redis:url=rediss://u:p@h:1/0?ssl_cert_reqs=none,prefix=kv",
         "redis", {"url": "rediss://u:p@h:1/0?ssl_cert_reqs=none", "prefix": "kv"}),
        ("pkg.mod:factory", "pkg.mod:factory", {}),
        ("pkg.mod:factory:root=/x:y,n=2", "pkg.mod:factory", {"root": "/x:y", "n": "2"}),
        ("vllm:my.mod:Tier:size=3", "vllm:my.mod:Tier", {"size": "3"}),
        ("cluster:nodes=a:1,b:2,c:3,prefix=p", "cluster", {"nodes": "a:1,b:2,c:3", "prefix": "p"}),
        ("fs:root=/mnt/a b", "fs", {"root": "/mnt/a b"}),
    ],
)
def test_names_and_options_are_read_as_written(text: str, name: str, options: dict[str, str]) -> None:
    assert parse_tier_arg(text) == (name, options)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (":a=1", "':a=1': a tier name must come before ':' and its options"),
        ("fs:=3", "fs: option '=3' is not NAME=VALUE"),
        ("fs:1a=2", "fs: option '1a=2': '1a' is not an option name"),
        ("fs:a=1,a=2", "fs: option 'a' is given twice"),
        ("fs:a=", "fs: option 'a=' is not NAME=VALUE"),
        ("fs:a=1,", "fs: option '' is not NAME=VALUE"),
    ],
)
def test_bad_option_text_is_an_error_naming_the_item(text: str, message: str) -> None:
    with pytest.raises(TierOptionError) as caught:
        parse_tier_arg(text)
    assert str(caught.value) == message


def factory(  # type: ignore[no-untyped-def]  # ``untyped`` has no annotation on purpose
    buffer: memoryview,
    *,
    prefix: str = "",
    port: int = 0,
    ratio: float = 0.5,
    tls: bool = False,
    root: Path | None = None,
    mode: Literal["lru", "fifo"] = "lru",
    capacity_bytes: int | None = None,
    password: str | None = None,
    untyped=None,  # no annotation: its value is typed by its look
) -> None:
    raise AssertionError("never called: its signature is what the tests read")


def typed(**options: object) -> dict[str, object]:
    return typed_options("t", factory, options, positional=1)


def test_text_values_are_converted_by_the_factorys_annotations() -> None:
    assert typed(prefix="123", port="6379", ratio="2", tls="yes", root="/x", mode="fifo", capacity_bytes="1GiB") == {
        "prefix": "123", "port": 6379, "ratio": 2.0, "tls": True, "root": Path("/x"), "mode": "fifo",
        "capacity_bytes": 1 << 30,
    }
    assert typed(password="none", root="null") == {"password": None, "root": None}
    assert typed(password="s3cr:et=") == {"password": "s3cr:et="}
    assert typed(untyped="12") == {"untyped": 12} and typed(untyped="true") == {"untyped": True}
    assert typed(port=7, tls=False) == {"port": 7, "tls": False}  # from a JSON config: passed as they are


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"port": "x"}, "t: option port='x' is not a whole number"),
        ({"ratio": "fast"}, "t: option ratio='fast' is not a number"),
        ({"tls": "maybe"}, "t: option tls='maybe' is not true or false"),
        ({"mode": "random"}, "t: option mode='random' is not one of 'lru', 'fifo'"),
        ({"capacity_bytes": "12XB"}, "t: capacity_bytes='12XB' is not a size"),
        ({"size": "1"}, "t: unknown option 'size'; its factory takes: capacity_bytes, mode, password, port, prefix, "
                        "ratio, root, tls, untyped"),
    ],
)
def test_a_value_that_does_not_convert_is_an_error_naming_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(TierOptionError) as caught:
        typed(**options)
    assert str(caught.value).startswith(message)


def test_simulate_passes_urls_and_text_as_written(tmp_path: Path) -> None:
    """``--secondary NAME:url=redis://127.0.0.1:6379/0,prefix=123`` works as written: the URL keeps its
    ``:``, and ``prefix=123`` reaches a ``str`` parameter as text (it used to arrive as an int)."""
    report = tmp_path / "report.json"
    target = "tests.kvproto.sim_tiers:remote_memory:url=redis://127.0.0.1:6379/0,prefix=123"
    assert kvproto_cli(["simulate", "--secondary", target, "--steps", "50", "--step-ms", "0", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["stack"]["secondaries"] == ["remote123"]
    options = data["config"]["tier_options"]["tests.kvproto.sim_tiers:remote_memory"]
    sized = options.pop("capacity_blocks")  # the simulator sized it: its factory takes capacity_blocks
    assert options == {"url": "redis://127.0.0.1:6379/0", "prefix": "123"} and sized > 0


def test_conform_gives_a_kvproto_tier_its_options_typed_the_same_way(tmp_path: Path) -> None:
    """``kvproto conform TARGET --option KEY=VALUE``: the tier's factory gets the option, typed by its
    annotation (a kvproto tier's option stays text until then; an engine class's is JSON)."""
    report = tmp_path / "report.json"
    code = kvproto_cli(["conform", "memory", "--option", "capacity_blocks=64", "--no-typecheck",
                        "-k", "test_empty_tier_misses", "--json", str(report)])
    data = json.loads(report.read_text())
    (tier,) = data["tiers"]
    assert code == 0 and "capacity_blocks=64" in tier["description"]
