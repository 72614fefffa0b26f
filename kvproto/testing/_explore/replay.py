"""A failure the explorer found, as a test its author pastes into their suite (KIT-23).

Hypothesis reports a failing state machine run as the calls that made it (``state = ...()``,
``state.store(keys=[...], who=1)``, ..., ``state.teardown()``), in the failure's notes. The explorer's
rules take only plain values (instance numbers, keys as bytes, booleans), so those calls replay as they
are: :func:`replay_test` wraps them in a test method that builds the same explorer (the row's operation
kinds and block size) over the class's own tier factory and hooks. The same calls on the same tier reach
the same verdict (KIT-19): the test fails until the tier is fixed, then passes.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["REPLAY_NOTE", "replay_steps", "replay_test"]

REPLAY_NOTE = "Replay it in your suite"
"""How the note that holds the replay test begins (the CLI's report and tests find it by this)."""

_HEADER = "Failing test case: <state machine>"
_END = "state.teardown()"


def replay_steps(notes: Iterable[str]) -> list[str] | None:
    """The calls Hypothesis reported after ``state = ...()`` up to ``state.teardown()`` (exclusive), each
    call's continuation lines kept with it; None where the notes hold no state machine's failing case."""
    lines = [line for note in notes for line in note.splitlines()]
    try:
        at = lines.index(_HEADER)
    except ValueError:
        return None
    steps: list[str] = []
    for line in lines[at + 1 :]:
        if line == _END:
            return steps
        if line.startswith("state = "):
            continue  # the test builds its own machine
        steps.append(line)
    return None  # cut short: no teardown reported, so not a whole run


def replay_test(notes: Iterable[str], *, kinds: Iterable[str], block_size: int, why: str) -> str | None:
    """Python source of a test method that replays the failing run in ``notes`` (None without one): paste
    it into the ``SecondaryTierTests`` subclass that runs the tier (its ``tier_factory`` fixture and
    ``reopen`` hook build the explorer's instances). ``why`` (the failure's first line) becomes its docstring."""
    steps = replay_steps(notes)
    if steps is None:
        return None
    headline = why.splitlines()[0] if why else "the explorer's failure"
    docstring = repr(f"Found by kvproto's explorer (KIT-23): {headline}")  # a literal whatever quotes it holds
    body = "\n".join(f"            {line}" for line in steps) or "            pass"
    return (
        "    # from kvproto.testing import SecondaryTierFactory\n"
        "    # from kvproto.testing.explore import explorer_for\n"
        "    def test_explorer_replay(self, tier_factory: SecondaryTierFactory) -> None:\n"
        f"        {docstring}\n"
        f"        machine = explorer_for(self, tier_factory, kinds=frozenset({sorted(kinds)!r}), block_size={block_size})\n"
        "        state = machine()\n"
        "        try:\n"
        f"{body}\n"
        "        finally:\n"
        "            state.teardown()\n"
    )
