"""What the kit's state machines did to a tier, kept so that every failure can show it (KIT-3).

A :class:`StepRecorder` serves one state-machine check. Each tier the machine
builds (one per Hypothesis example) gets a :class:`StepLog`: every call the kit
makes on the tier, in order, with its keys, job ids and answer, grouped by the
machine rule that made it. Hypothesis prints the rules of a failing example
only when it can replay the failure; a threaded tier's failure often does not
replay, so the kit keeps its own record of the example that failed and puts it
in the failure's message, replayed or not.

A failure Hypothesis reports as ``Flaky`` is explained by :func:`explain_flaky`:
a clause seen broken once is still that clause (marked timing-dependent, with
the steps of the run that broke it); a tier that merely answered the same
operations differently from one run to the next (``FlakyStrategyDefinition``),
or raised an error once, is reported as :class:`NondeterministicTier`, which
names no clause.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import CodeType, FrameType, FunctionType
from typing import Any

from kvproto._jobs import JobResult, PrepareStoreOutput, TransferJob
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure

__all__ = [
    "STEPS_HEADING",
    "NondeterministicTier",
    "StepLog",
    "StepRecorder",
    "explain_flaky",
    "with_steps",
]

#: The line that starts the recorded steps in a failure's message.
STEPS_HEADING = "Steps that led to it"

#: Every tier method the kit may call (both protocols, and the optional lookup_many).
TIER_METHODS = (
    "lookup",
    "lookup_many",
    "touch",
    "submit_store",
    "submit_load",
    "get_finished_jobs",
    "on_step_end",
    "on_request_finished",
    "take_events",
    "has_pending_work",
    "reset_cache",
    "shutdown",
    "prepare_store",
    "complete_store",
    "prepare_load",
    "complete_load",
)

#: Backdoor hooks the machines call, recorded as steps too (they change what the tier does next).
HOOKS = ("fail_next_jobs", "fail_keys", "corrupt_on_read", "seed_block")

_SHOWN_STEPS = 100  # the last this many steps are shown; earlier ones are counted
_KEPT_CALLS = 20_000  # calls kept per example (a runaway loop must not eat the memory)
_KEPT_FAILED = 16  # failed examples kept per check (Hypothesis stops at the first in most profiles)


class NondeterministicTier(Exception):
    """The tier did not behave the same way twice on the same operations, and no clause was seen
    broken: the check has no verdict (KIT-3). Its message says what differed and lists the steps."""


@dataclass
class _Call:
    step: int
    rule: str
    method: str
    args: tuple[Any, ...]
    result: Any = None
    raised: BaseException | None = None


@dataclass
class StepLog:
    """Every call the kit made on one tier (one Hypothesis example), and how the example ended."""

    number: int
    calls: list[_Call] = field(default_factory=list)
    dropped: int = 0
    steps: int = 0
    failure: BaseException | None = None
    later: BaseException | None = None  # a failure while tearing down after ``failure``
    _frame: FrameType | None = None  # the rule frame of the current step (kept alive: compared by identity)

    def add(self, call: _Call) -> None:
        if len(self.calls) >= _KEPT_CALLS:
            del self.calls[: _KEPT_CALLS // 10]
            self.dropped += _KEPT_CALLS // 10
        self.calls.append(call)

    def render(self, *, limit: int = _SHOWN_STEPS) -> str:
        """The heading and one line per step: ``  12 lookup   lookup(ab..) -> HIT; ...``."""
        lines: list[str] = []
        for step, rule, texts in self._steps():
            lines.append(f"  {step:>3} {rule}: {'; '.join(_collapse(texts))}")
        hidden = max(0, len(lines) - limit)
        shown = lines[hidden:]
        count = f"{self.steps} step{'s' if self.steps != 1 else ''}"
        heading = (
            f"{STEPS_HEADING} (example {self.number} of the check, {count}): each step is a rule "
            "of the kit's state machine and the calls it made on the tier, in order (rules that "
            "made none are left out; a key shows its first 12 and last 8 hex digits):"
        )
        if not shown:
            return f"{heading}\n  (no call on the tier was recorded)"
        if hidden or self.dropped:
            shown.insert(0, f"  ... ({hidden} earlier steps not shown)" if hidden else "  ... (earlier calls not kept)")
        if self.later is not None:
            shown.append(f"  then, tearing the machine down: {_one_line(self.later)}")
        return "\n".join([heading, *shown])

    def _steps(self) -> Iterator[tuple[int | str, str, list[str]]]:
        current: tuple[int, str] | None = None
        texts: list[str] = []
        for call in self.calls:
            key = (call.step, call.rule)
            if call.step < 0:  # a call from one of the tier's own threads
                if current is not None and texts:
                    yield current[0], current[1], texts
                    current, texts = None, []
                yield "-", call.rule, [_describe(call)]
                continue
            if key != current:
                if current is not None and texts:
                    yield current[0], current[1], texts
                current, texts = key, []
            texts.append(_describe(call))
        if current is not None and texts:
            yield current[0], current[1], texts


def _collapse(texts: Sequence[str]) -> list[str]:
    """Merge ``on_step_end()`` with the ``get_finished_jobs()`` right after it, then runs of the same text."""
    merged: list[str] = []
    i = 0
    while i < len(texts):
        text = texts[i]
        if text == "on_step_end()" and i + 1 < len(texts) and texts[i + 1].startswith("get_finished_jobs()"):
            text = f"on_step_end() + {texts[i + 1]}"
            i += 1
        merged.append(text)
        i += 1
    out: list[str] = []
    count = 0
    for j, text in enumerate(merged):
        count += 1
        if j + 1 < len(merged) and merged[j + 1] == text:
            continue
        out.append(text if count == 1 else f"{text} (x{count})")
        count = 0
    return out


def _one_line(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return text if isinstance(error, ConformanceFailure) else f"{type(error).__name__}: {text}"


def _keys(keys: object) -> str:
    if isinstance(keys, (list, tuple, frozenset, set)):
        return "[" + ", ".join(short_key(k) if isinstance(k, bytes) else repr(k) for k in keys) + "]"
    return _value(keys)


def _job(job: object) -> str:
    if not isinstance(job, TransferJob):
        return _value(job)
    moves = ", ".join(f"{short_key(k)} -> slot {s}" for k, s in zip(job.keys, job.slots, strict=True))
    req = "" if job.req_id in (None, "kvproto-kit") else f", request {job.req_id}"
    return f"job {job.job_id}: {moves}{req}"


def _result(result: object) -> str:
    if not isinstance(result, JobResult):
        return _value(result)
    if result.success:
        return f"job {result.job_id} ok"
    if result.succeeded:
        return f"job {result.job_id} failed, succeeded {_keys(sorted(result.succeeded))}"
    return f"job {result.job_id} failed"


def _value(value: object) -> str:
    if isinstance(value, LookupResult):
        return value.name
    if isinstance(value, bytes):
        return short_key(value)
    if isinstance(value, ReqContext):
        return f"request {value.req_id}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _describe(call: _Call) -> str:
    """One call as the tier author would write it, with its answer."""
    name, args = call.method, call.args
    match name:
        case "lookup" | "prepare_load" | "lookup_many" | "prepare_store":
            shown = _value(args[0]) if name == "lookup" and args else _keys(args[0]) if args else ""
            context = args[1] if len(args) > 1 else None
            if isinstance(context, ReqContext) and context.req_id != "kvproto-kit":
                shown += f", request {context.req_id}"
        case "submit_store" | "submit_load":
            shown = _job(args[0]) if args else ""
        case "complete_store":
            shown = f"{_keys(args[0])}, success={args[1]!r}" if len(args) > 1 else _keys(args[0]) if args else ""
        case "touch" | "complete_load" | "fail_keys" | "corrupt_on_read":
            shown = _keys(args[0]) if args else ""
        case _:
            shown = ", ".join(_value(a) for a in args)
    text = f"{name}({shown})"
    if call.raised is not None:
        return f"{text} raised {type(call.raised).__name__}: {str(call.raised).splitlines()[0] if str(call.raised) else ''}"
    result = call.result
    match name:
        case "get_finished_jobs":
            try:
                items = list(result)
            except TypeError:
                return f"{text} -> {_value(result)}"
            return f"{text} -> [{', '.join(_result(r) for r in items)}]"
        case "lookup_many":
            if isinstance(result, list):
                return f"{text} -> [{', '.join(_value(r) for r in result)}]"
        case "prepare_store":
            if isinstance(result, PrepareStoreOutput):
                # Not strict: the trace shows what a tier under test answered, mismatched lengths included.
                pairs = zip(result.keys_to_store, result.slots, strict=False)
                moves = ", ".join(f"{short_key(k)} -> slot {s}" for k, s in pairs)
                evicted = f"; evicted {_keys(result.evicted)}" if result.evicted else ""
                return f"{text} -> [{moves}]{evicted}"
        case "take_events":
            try:
                return f"{text} -> {len(list(result))} events"
            except TypeError:
                pass
        case "on_step_end" | "touch" | "submit_store" | "submit_load" | "complete_store" | "complete_load" | "shutdown":
            if result is None:
                return text
        case _:
            pass
    if result is None and name in HOOKS:
        return text
    return f"{text} -> {_value(result)}"


class StepRecorder:
    """Records, for one state-machine check, the calls made on each tier the machine builds.

    ``rules``: the machine class whose methods are the steps (a call is credited to the
    outermost machine method on the stack, i.e. the rule that made it)."""

    def __init__(self, machine: type) -> None:
        self._rule_names: dict[CodeType, str] = {}
        for klass in machine.__mro__:
            if klass.__module__.startswith("hypothesis"):
                break
            for name, value in vars(klass).items():
                # A rule is the function Hypothesis's decorators wrap (``__wrapped__``).
                while isinstance(value, FunctionType):
                    self._rule_names.setdefault(value.__code__, name)
                    value = getattr(value, "__wrapped__", None)
        self.current: StepLog | None = None
        self.failed: list[StepLog] = []
        self.examples = 0
        self._local = threading.local()
        self._main = threading.get_ident()

    # ---- building the record --------------------------------------------------------------
    def traced_factory(self, factory: Callable[..., Any]) -> Callable[..., Any]:
        """``factory``, whose every tier starts a new log and has its calls recorded."""

        def build(*args: Any) -> Any:
            tier = factory(*args)
            self.examples += 1
            log = StepLog(self.examples)
            self.current = log
            self._instrument(tier, log)
            return tier

        return build

    def _instrument(self, tier: object, log: StepLog) -> None:
        for name in TIER_METHODS:
            method = getattr(tier, name, None)
            if not callable(method):
                continue
            try:
                setattr(tier, name, self._traced(name, method, lambda: log))
            except (AttributeError, TypeError):  # __slots__ or a frozen class: calls go unrecorded
                return

    def trace_hooks(self, owner: object, names: Sequence[str] = HOOKS) -> Callable[[], None]:
        """Record the backdoor hooks ``owner`` (the kit's test object) defines; the call returned
        undoes it."""
        added: list[str] = []
        for name in names:
            method = getattr(owner, name, None)
            if callable(method) and name not in vars(owner):
                try:
                    setattr(owner, name, self._traced(name, method, lambda: self.current, hook=True))
                except (AttributeError, TypeError):
                    continue
                added.append(name)

        def undo() -> None:
            for name in added:
                vars(owner).pop(name, None)

        return undo

    def _traced(
        self, name: str, method: Callable[..., Any], log_of: Callable[[], StepLog | None], *, hook: bool = False
    ) -> Callable[..., Any]:
        local = self._local

        def traced(*args: Any, **kwargs: Any) -> Any:
            depth: int = getattr(local, "depth", 0)
            log = log_of()
            if depth or log is None:  # a call the tier makes on itself, or outside any example
                return method(*args, **kwargs)
            shown = args[1:] if hook else args  # a hook's first argument is the tier
            call = _Call(*self._where(log), name, tuple(shown) + tuple(kwargs.values()))
            local.depth = depth + 1
            try:
                call.result = method(*args, **kwargs)
            except BaseException as exc:
                call.raised = exc
                raise
            finally:
                local.depth = depth
                log.add(call)
            return call.result

        return traced

    def _where(self, log: StepLog) -> tuple[int, str]:
        """The step number and rule name of a call being made now."""
        if threading.get_ident() != self._main:
            return -1, f"thread {threading.current_thread().name}"
        frame: FrameType | None = sys._getframe(2)  # 0: here, 1: traced, 2: the caller
        rule: tuple[str, FrameType] | None = None
        depth = 0
        while frame is not None and depth < 40:
            name = self._rule_names.get(frame.f_code)
            if name is not None:
                rule = (name, frame)
            elif rule is not None:
                break
            frame = frame.f_back
            depth += 1
        if rule is None:
            return max(log.steps, 0), "-"
        if rule[1] is not log._frame:
            log._frame = rule[1]
            log.steps += 1
        return log.steps, rule[0]

    # ---- how each example ended -----------------------------------------------------------
    def start(self) -> BaseException | None:
        """Called as an example's machine is built: the exception being handled around it, if
        any (not the example's own)."""
        return sys.exception()

    def finish(self, outer: BaseException | None, teardown: Callable[[], None]) -> None:
        """Run the machine's ``teardown`` as its example ends, noting how the example ended.

        A failure raised by the teardown after the example already failed with a
        ConformanceFailure or an error of the tier is noted and the first failure kept: the
        settling that follows a broken step usually fails for the same reason, later."""
        log = self.current
        failing = sys.exception()
        if failing is outer or not isinstance(failing, Exception):
            failing = None  # none, another's, or Hypothesis's own control flow (StopTest)
        try:
            teardown()
        except Exception as later:
            if log is not None:
                if failing is None:
                    log.failure = later
                else:
                    log.failure, log.later = failing, later
                self._keep(log)
            if failing is None or _from_hypothesis(failing):
                raise
            return
        finally:
            if log is not None:
                log._frame = None
        if log is not None and failing is not None:
            log.failure = failing
            self._keep(log)

    def _keep(self, log: StepLog) -> None:
        if log not in self.failed:
            self.failed.append(log)
            del self.failed[:-_KEPT_FAILED]

    def log_of(self, error: BaseException) -> StepLog | None:
        """The log of the example that ended with ``error``."""
        return next((log for log in self.failed if log.failure is error), None)


def _from_hypothesis(error: BaseException) -> bool:
    return type(error).__module__.startswith("hypothesis")


def with_steps(failure: ConformanceFailure, log: StepLog | None, *, note: str = "") -> ConformanceFailure:
    """``failure`` with ``note`` and the recorded steps added to its message (Hypothesis's own
    notes move to it)."""
    detail = failure.detail + note
    if log is not None:
        detail += "\n" + log.render()
    made = ConformanceFailure(failure.clause, detail)
    _move_notes(failure, made)
    return made


def _move_notes(source: BaseException, target: BaseException) -> None:
    """Hypothesis's notes (how to reproduce) go with the exception reported, shown once."""
    for text in getattr(source, "__notes__", ()):
        target.add_note(text)
    if hasattr(source, "__notes__"):
        del source.__notes__


def _walk(error: BaseException) -> Iterator[BaseException]:
    """``error``, the exceptions it groups, and their causes, depth first, each once."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        found = stack.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        yield found
        linked = [found.__cause__, found.__context__]
        if isinstance(found, BaseExceptionGroup):
            linked += list(found.exceptions)
        stack.extend(e for e in reversed(linked) if e is not None)


_REPLAYED = "when Hypothesis ran the same operations again on a fresh tier"


def explain_flaky(flaky: BaseException, recorder: StepRecorder) -> BaseException:
    """What a ``Flaky`` from Hypothesis means for the tier, as the exception to report.

    A ConformanceFailure seen in it, or in any example of the check, was a real contract
    break: it is reported on its clause, marked timing-dependent, with the steps of the
    example that broke it. Otherwise the tier raised an error once, or answered the same
    operations differently (``FlakyStrategyDefinition``): a :class:`NondeterministicTier`,
    blaming no clause, with the steps of the example concerned."""
    inside = list(_walk(flaky))
    broke = next((e for e in inside if isinstance(e, ConformanceFailure)), None)
    if broke is None:
        broke = next((log.failure for log in recorder.failed if isinstance(log.failure, ConformanceFailure)), None)
    made: Exception
    if isinstance(broke, ConformanceFailure):
        log = recorder.log_of(broke)
        made = with_steps(
            broke, log, note=f" (timing-dependent: it happened once and did not {_REPLAYED})"
        )
    else:
        raised: BaseException | None = next(
            (e for e in inside if not _from_hypothesis(e) and isinstance(e, Exception)), None
        )
        if raised is None:
            raised = next(
                (log.failure for log in recorder.failed if log.failure is not None and not _from_hypothesis(log.failure)),
                None,
            )
        if raised is not None:
            log = recorder.log_of(raised)
            what = (
                f"the tier raised {_one_line(raised)} once, and not {_REPLAYED}: an error that "
                "depends on timing (a worker thread?) or on state shared between instances. "
                "No clause was seen broken, so this check has no verdict"
            )
        else:
            log = next((log for log in reversed(recorder.failed) if log.failure is not None), None) or recorder.current
            reason = str(flaky).strip().splitlines()
            said = next((line for line in reason[1:] if line.strip()), reason[0] if reason else type(flaky).__name__)
            what = (
                f"the tier answered the same operations differently from one run to the next "
                f"(Hypothesis: {said.strip()}), so the kit's search could not go on. No clause was seen "
                "broken, so this check has no verdict: answers that depend on timing (a worker thread) "
                "or on state shared between instances do this"
            )
        made = NondeterministicTier(what if log is None else f"{what}.\n{log.render()}")
    _move_notes(flaky, made)
    return made
