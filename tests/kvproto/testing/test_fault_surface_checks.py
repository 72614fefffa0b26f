"""TIER-38's recorder (``kvproto.testing.programming_errors_logged``, also for a tier's own tests): which
log records it keeps. The check
itself passes the fs and obj reference tiers (tests/impls/fs|obj/test_conformance.py, every check
through the entry point) and fails its gallery tier
(gallery_namespace.py: listing_warning_raises, test_gallery.py)."""

from __future__ import annotations

import errno
import logging

from kvproto.testing import programming_errors_logged

_log = logging.getLogger("kvproto.test.fault_surface")


def test_a_programming_error_among_the_arguments_or_as_exc_info_is_kept() -> None:
    with programming_errors_logged() as found:
        _log.warning("checking one by one: %s", IndexError("list index out of range"))
        table: dict[str, int] = {}
        try:
            table["missing"] += 1
        except KeyError:
            _log.warning("a fallback", exc_info=True)
        _log.warning("named: %(error)s", {"error": AttributeError("no attribute x")})
    assert [type(error) for _, error in found] == [IndexError, KeyError, AttributeError]
    assert found[0][0].getMessage() == "checking one by one: list index out of range"


def test_storage_errors_and_plain_words_are_not_kept() -> None:
    with programming_errors_logged() as found:
        _log.warning("a read failed: %s", OSError(errno.EIO, "injected"))
        _log.warning("timed out: %s", TimeoutError("slow store"))
        _log.warning("a reply it cannot parse: %s", ValueError("bad XML"))
        _log.warning("the words IndexError and TypeError alone: %s", "IndexError")
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "down")
        except ConnectionRefusedError:
            _log.error("the store is down", exc_info=True)
    assert found == []


def test_records_after_the_block_are_not_kept() -> None:
    with programming_errors_logged() as found:
        pass
    _log.warning("after: %s", TypeError("late"))
    assert found == []
