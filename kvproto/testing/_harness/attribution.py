"""Who a check's failure belongs to (KIT-17): the tier, a backdoor hook, or a set-up step.

* An exception the tier raised inside a check is that check's failure, on the check's clause,
  with the tier's own frames of the traceback in the failure's notes (they reach the report's
  details).
* An exception a backdoor hook raised is the hook's fault: :class:`HookRaised` (KIT-5).
* A failure that follows a store the kit made no fault for, but that the tier reported failed,
  is :class:`SetUpFailed` on the clause that governs the store (TIER-10), not on the check's own
  clause: the check could not set up, so it judged nothing.
"""

from __future__ import annotations

import functools
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from kvproto.testing._harness.failures import ConformanceFailure, HookRaised, SetUpFailed

__all__ = ["STORE_CLAUSES", "SetUpRecord", "attributed", "report_hooks", "tier_frames"]

#: The clauses of a job's report (each job reported once, ``succeeded`` a subset, whole without
#: partial_jobs): a failure on them is the tier's, whatever set-up failed before it.
STORE_CLAUSES = frozenset({"TIER-11", "CAP-4"})

_KIT = str(Path(__file__).resolve().parents[1])  # kvproto/testing: every wing of the kit
_FRAMEWORKS = tuple(
    f"{Path(p).resolve()}"
    for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
_FRAMEWORK_PACKAGES = ("_pytest", "pytest", "pluggy", "hypothesis")


class SetUpRecord(Protocol):
    """What a driver records about set-up steps that failed with no fault injected."""

    setup_failures: list[str]
    faults_injected: bool


def _is_kit(filename: str) -> bool:
    path = str(Path(filename).resolve()) if filename and not filename.startswith("<") else filename
    if path.startswith(_KIT):
        return True
    for root in _FRAMEWORKS:
        if path.startswith(root):
            rest = path[len(root) :].lstrip("/\\")
            return rest.split("/", 1)[0].split("\\", 1)[0] in _FRAMEWORK_PACKAGES
    return False


def tier_frames(error: BaseException) -> list[traceback.FrameSummary] | None:
    """The frames of ``error``'s traceback below the kit's last one, where one of them is the
    tier's code (not the standard library): the tier raised it. None when the kit (or pytest,
    Hypothesis) raised it itself."""
    frames = traceback.extract_tb(error.__traceback__)
    last_kit = max((i for i, f in enumerate(frames) if _is_kit(f.filename)), default=-1)
    below = frames[last_kit + 1 :]
    if not below or all(str(Path(f.filename).resolve()).startswith(_STDLIB) for f in below):
        return None
    return below


def _tier_error(clause: str, error: Exception, frames: list[traceback.FrameSummary]) -> ConformanceFailure:
    where = frames[-1]
    failure = ConformanceFailure(
        clause,
        f"the tier raised {type(error).__name__}: {error} (in {where.name}, "
        f"{Path(where.filename).name}:{where.lineno}; its traceback is in the details)",
    )
    failure.add_note("The tier's traceback (most recent call last):\n" + "".join(traceback.format_list(frames)).rstrip())
    for note in getattr(error, "__notes__", ()):
        failure.add_note(str(note))
    return failure


def attributed(clause: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a check of ``clause``), reporting what it raises against whom it belongs to (KIT-17)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SetUpFailed:
            raise
        except ConformanceFailure as failure:
            kit = kwargs.get("kit")
            failures: object = getattr(kit, "setup_failures", None)
            if isinstance(failures, list) and failures and failure.clause not in STORE_CLAUSES:
                if not isinstance(failure, HookRaised):
                    raise SetUpFailed("TIER-10", str(failures[0]), clause, str(failure)) from failure
            raise
        except Exception as error:
            from kvproto.testing._harness.steps import NondeterministicTier

            if isinstance(error, NondeterministicTier):
                raise
            frames = tier_frames(error)
            if frames is None:
                raise
            raise _tier_error(clause, error, frames) from error

    return run


def report_hooks(test: object, names: tuple[str, ...], has_hook: Callable[[str], bool], kit: SetUpRecord) -> None:
    """Make each backdoor hook ``test`` defines say so when it raises (:class:`HookRaised`), and
    tell ``kit`` a fault was injected once a fault hook ran (its later failed stores are no set-up
    failure). The wrappers live on the instance, one check long."""
    faults = {"fail_next_jobs", "fail_keys", "corrupt_on_read", "short_io", "fail_io", "refuse_direct", "lose_directories",
              "refuse_links", "fail_sync"}
    for name in names:
        if not has_hook(name) or name in vars(test):
            continue
        method: Callable[..., Any] = getattr(test, name)

        def hook(*args: Any, _name: str = name, _method: Callable[..., Any] = method) -> Any:
            if _name in faults:
                kit.faults_injected = True
            try:
                return _method(*args)
            except ConformanceFailure:
                raise
            except Exception as error:
                raised = HookRaised(_name, error)
                raised.add_note(
                    f"The hook's traceback (most recent call last):\n{''.join(traceback.format_tb(error.__traceback__)).rstrip()}"
                )
                raise raised from error

        setattr(test, name, hook)
