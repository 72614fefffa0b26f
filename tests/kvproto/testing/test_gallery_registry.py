"""The gallery's registration (gallery_registry.py): each target names the factory it registered, a
module attribute ``kvproto conform`` reaches; nested factories and targets registered twice are refused."""

from __future__ import annotations

import importlib

import pytest

from kvproto.errors import InvalidArgumentError
from kvproto.testing import TierSpec

from tests.kvproto.testing.gallery_index import GALLERY
from tests.kvproto.testing.gallery_registry import Expected, Gallery


def _spec() -> TierSpec:
    return TierSpec("registered", "secondary", lambda buffer: None)


def test_every_target_is_its_modules_factory() -> None:
    for target in GALLERY:
        module, name = target.split(":")
        factory = getattr(importlib.import_module(module), name)
        assert callable(factory) and factory.__name__ == name, target


def test_a_factory_registers_its_module_and_name_and_stays_itself() -> None:
    gallery = Gallery()
    registered = gallery.fails("test_x", "TIER-4", "words")(_spec)
    assert registered is _spec
    assert gallery == {f"{__name__}:_spec": Expected("test_x", "TIER-4", "words")}


def test_a_target_registered_twice_is_refused() -> None:
    gallery = Gallery()
    gallery.fails("test_x", "TIER-4", "words")(_spec)
    with pytest.raises(InvalidArgumentError, match="registered twice"):
        gallery.fails("test_y", "TIER-5", "other")(_spec)


def test_a_nested_factory_is_refused() -> None:
    def nested() -> TierSpec:
        return _spec()

    with pytest.raises(InvalidArgumentError, match="not a module attribute"):
        Gallery().fails("test_x", "TIER-4", "words")(nested)
