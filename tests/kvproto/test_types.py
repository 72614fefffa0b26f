"""Type-level contract: strict mypy, with kvproto's mypy.ini, rejects the mistakes the enum exists to catch.

One mypy run checks every snippet (each is its own file, so each file's
errors are its own); the assertions name the exact error codes.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

REPO = Path(__file__).resolve().parents[2]

_TIER = '''
from collections.abc import Iterable, Sequence
from kvproto import (JobResult, LookupResult, OffloadingEvent, OffloadKey, ReqContext,
                     SecondaryTier, TransferJob)

class {name}:
    @property
    def name(self) -> str:
        return "t"
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> {lookup_type}:
        return {lookup_value}
    def touch(self, keys: Iterable[OffloadKey]) -> None: ...
    def submit_store(self, job: TransferJob) -> None: ...
    def submit_load(self, job: TransferJob) -> None: ...
    def get_finished_jobs(self) -> Sequence[JobResult]:
        return ()
    def on_request_finished(self, req_context: ReqContext) -> None: ...
    def on_step_end(self) -> None: ...
    def take_events(self) -> Sequence[OffloadingEvent]:
        return ()
    def has_pending_work(self) -> bool:
        return False
    def reset_cache(self) -> bool:
        return True
    def shutdown(self) -> None: ...

tier: SecondaryTier = {name}()
'''

# ``blocks()``, its default branch calling unreachable(); {hit_pending} is the HIT_PENDING case or nothing.
_BLOCKS = '''
from kvproto import LookupResult, unreachable
from kvproto import members as lr

def blocks(result: LookupResult) -> int:
    match result:
        case lr.HIT:
            return 1
        {hit_pending}case lr.MISS:
            return 0
        case lr.RETRY:
            return 0
        case _:
            unreachable(result, where="blocks")
'''

SNIPPETS = {
    "match_missing_member": '''
        from kvproto import LookupResult

        def report(result: LookupResult) -> None:
            match result:
                case LookupResult.HIT:
                    print("hit")
                case LookupResult.MISS:
                    print("miss")
                case LookupResult.RETRY:
                    print("retry")
    ''',
    "match_missing_member_with_default": _BLOCKS.format(hit_pending=""),
    "match_complete": _BLOCKS.format(hit_pending="case lr.HIT_PENDING:\n            return 1\n        "),
    "truthy_lookup": '''
        from kvproto import OffloadKey, ReqContext, SecondaryTier

        def report(tier: SecondaryTier, key: OffloadKey, req: ReqContext) -> None:
            if tier.lookup(key, req):
                print("loadable")
    ''',
    "legacy_tier": _TIER.format(name="LegacyTier", lookup_type="bool | None", lookup_value="None"),
    "conforming_tier": _TIER.format(
        name="MinimalTier", lookup_type="LookupResult", lookup_value="LookupResult.MISS"
    ),
}

_ERROR = re.compile(r"^(?P<file>[^:]+\.py):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Error codes per snippet, from one strict mypy run over all of them."""
    root = tmp_path_factory.mktemp("snippets")
    files = []
    for name, text in SNIPPETS.items():
        path = root / f"{name}.py"
        path.write_text(textwrap.dedent(text))
        files.append(str(path))
    stdout, stderr, status = mypy_api.run(
        [
            "--config-file", str(REPO / "mypy.ini"),
            "--cache-dir", str(root / ".mypy_cache"),
            "--no-error-summary",
            *files,
        ]
    )
    assert status in (0, 1), stderr or stdout  # 2 would be a crash or a usage error
    errors: dict[str, list[str]] = {name: [] for name in SNIPPETS}
    for line in stdout.splitlines():
        found = _ERROR.match(line)
        if found:
            errors[Path(found["file"]).stem].append(found["code"])
    return errors


def test_match_missing_a_member_is_rejected(mypy_errors: dict[str, list[str]]) -> None:
    """LR-1: mypy's exhaustive-match catches a forgotten member..."""
    assert mypy_errors["match_missing_member"] == ["exhaustive-match"]


def test_match_with_default_missing_a_member_is_rejected(mypy_errors: dict[str, list[str]]) -> None:
    """...and so does unreachable() in the default branch (its argument is not Never)."""
    assert mypy_errors["match_missing_member_with_default"] == ["arg-type"]


def test_complete_match_passes(mypy_errors: dict[str, list[str]]) -> None:
    assert mypy_errors["match_complete"] == []


def test_lookup_in_boolean_context_is_rejected(mypy_errors: dict[str, list[str]]) -> None:
    """LR-1: ``if tier.lookup(k):`` is a truthy-bool error."""
    assert mypy_errors["truthy_lookup"] == ["truthy-bool"]


def test_legacy_tier_does_not_satisfy_secondary_tier(mypy_errors: dict[str, list[str]]) -> None:
    """TIER-1: a lookup returning ``bool | None`` does not match the protocol."""
    assert mypy_errors["legacy_tier"] == ["assignment"]


def test_minimal_tier_satisfies_secondary_tier(mypy_errors: dict[str, list[str]]) -> None:
    """TIER-1: no base class needed; the methods and signatures are enough."""
    assert mypy_errors["conforming_tier"] == []
