"""``kvproto._field_rules`` through the public settings declared with it (:class:`kvproto.testing.KitLimits`,
:class:`kvproto.tierkit.BlobTierConfig`): every value a rule excludes is refused, naming the field, the
rule and the value; the values it allows are kept (KIT-7, TIERKIT-1)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from kvproto.errors import ConfigurationError
from kvproto.testing import KitLimits
from kvproto.tierkit import BlobTierConfig


def test_the_defaults_pass() -> None:
    assert KitLimits().max_job_steps == 64 and KitLimits().slow_calls_forgiven == 2


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("max_job_steps", 0, "max_job_steps must be an int >= 1, got 0"),
        ("max_job_steps", 2.0, "max_job_steps must be an int >= 1, got 2.0"),
        ("confirm_repeats", True, "confirm_repeats must be an int >= 1, got True"),
        ("slow_calls_forgiven", -1, "slow_calls_forgiven must be an int >= 0, got -1"),
        ("job_timeout_s", -0.1, "job_timeout_s must be a number >= 0, got -0.1"),
        ("lookup_budget_s", math.inf, "lookup_budget_s must be a number >= 0, got inf"),
        ("retry_step_interval_s", math.nan, "retry_step_interval_s must be a number >= 0, got nan"),
        ("job_timeout_s", "2", "job_timeout_s must be a number >= 0, got '2'"),
    ],
)
def test_a_value_the_rule_excludes_is_refused_naming_the_limit(name: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        replace(KitLimits(), **{name: value})
    assert str(raised.value) == f"KitLimits: {message}"


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_job_steps", 1), ("slow_calls_forgiven", 0), ("job_timeout_s", 0), ("lookup_budget_s", 0.5)],
)
def test_a_value_the_rule_allows_is_kept(name: str, value: Any) -> None:
    assert getattr(replace(KitLimits(), **{name: value}), name) == value


def test_the_first_broken_limit_in_declaration_order_is_named() -> None:
    with pytest.raises(ConfigurationError, match="^KitLimits: max_job_steps "):
        KitLimits(max_job_steps=0, confirm_repeats=0)


def test_a_class_that_reports_every_broken_field_names_them_all_in_declaration_order() -> None:
    """BlobTierConfig (TIERKIT-1) reports each field whose rule is broken, its own checks after them."""
    with pytest.raises(ConfigurationError) as raised:
        BlobTierConfig(read_threads=0, hold_hits_steps=-1, max_bytes=0, hold_hits_max=0, op_timeout_s=-1)
    assert str(raised.value) == (
        "invalid BlobTierConfig: max_bytes must be None or an int >= 1, got 0; read_threads must be an int >= 1, "
        "got 0; hold_hits_steps must be an int >= 0, got -1; hold_hits_max must be None or an int >= 1, got 0; "
        "op_timeout_s must be None or a finite number > 0, got -1"
    )
    assert BlobTierConfig(hold_hits_steps=0, hold_hits_max=None).hold_hits_steps == 0
