"""``kit.*`` options of an engine target (``kvproto conform vllm:MODULE:CLASS --option kit.FIELD=...``):
they add to what the engine's interface gives every tier of it, never replace it (issue 40's false
blames: a correct LMCache adapter failed CAP-4 without options, and an option dropped the defaults)."""

from __future__ import annotations

import pytest

from kvproto import Capabilities
from kvproto.errors import ConfigurationError
from kvproto.testing import split_kit_options

ENGINE = Capabilities(async_lookup=True, max_retry_steps=2, partial_jobs=True, reasons={"sharing": "one process",
                                                                                         "persistence": "memory"})


def test_kit_options_add_to_the_engines_defaults() -> None:
    given, caps = split_kit_options("t", {"size": 3, "kit.persistence": True, "kit.max_hold_steps": 4}, defaults=ENGINE)
    assert given == {"size": 3}
    assert caps == Capabilities(async_lookup=True, max_retry_steps=2, partial_jobs=True, persistence=True,
                                max_hold_steps=4, reasons={"sharing": "one process"})


def test_without_kit_options_the_defaults_stand() -> None:
    assert split_kit_options("t", {"size": 3}, defaults=ENGINE) == ({"size": 3}, ENGINE)
    assert split_kit_options("t", {"size": 3}) == ({"size": 3}, None)


def test_a_kit_option_can_take_back_a_default() -> None:
    _, caps = split_kit_options("t", {"kit.partial_jobs": False}, defaults=ENGINE)
    assert caps.partial_jobs is False and caps.async_lookup is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kit.speed": 1}, "t: --option kit.speed: not a capability (known: async_lookup, eviction, holds_hits, lru, "
                           "max_hold_steps, max_retry_steps, partial_jobs, persistence, sharing)"),
        ({"kit.max_hold_steps": True}, "t: --option kit.max_hold_steps: expected a JSON int, got True"),
        ({"kit.lru": 1}, "t: --option kit.lru: expected a JSON bool, got 1"),
    ],
)
def test_a_bad_kit_option_is_an_error_naming_it(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        split_kit_options("t", options, defaults=ENGINE)
    assert str(caught.value) == message
