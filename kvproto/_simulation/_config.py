"""What a simulated run does: :class:`SimConfig` and the faults it injects (:class:`FaultPlan`, ``--faults``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvproto._field_rules import check_fields, count, non_negative, optional_count, share
from kvproto.errors import ConfigurationError

__all__ = ["FAULT_KINDS", "RAISE_METHODS", "FaultPlan", "FaultSpecError", "SimConfig", "parse_faults"]


#: ``--faults`` items: name -> what its value means.
FAULT_KINDS: Mapping[str, str] = {
    "fail": "probability per step and secondary that its next job fails whole (FaultySecondary.fail_next_jobs)",
    "corrupt": "probability per promotion that the read is damaged and the tier detects it "
    "(FaultySecondary.corrupt_on_read(detect=True))",
    "latency": "extra steps every job takes and every key first asked answers RETRY "
    "(LatencySecondary(job_steps=N, lookup_steps=N))",
    "raise": "probability per step and secondary that one of its methods raises once (FaultySecondary.raise_in)",
    "brownout": "seconds every secondary stops answering, once every 4x that of run time (the first after it): "
    "jobs submitted meanwhile are held and no job is reported until it ends; lookups still answer",
}

#: The secondary methods a ``raise`` fault picks from.
RAISE_METHODS: tuple[str, ...] = (
    "lookup",
    "submit_load",
    "submit_store",
    "get_finished_jobs",
    "on_step_end",
    "on_request_finished",
    "take_events",
)



class FaultSpecError(ConfigurationError):
    """A ``--faults`` string that cannot be parsed; ``item`` is the offending item."""

    def __init__(self, message: str, *, item: str) -> None:
        super().__init__(message)
        self.item = item


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Which faults a run injects into every secondary tier (``kvproto simulate --faults``)."""

    fail: float = 0.0
    corrupt: float = 0.0
    latency: int = 0
    raise_: float = 0.0
    brownout: float = 0.0  # seconds; 0: off

    @property
    def any(self) -> bool:
        """True if any fault is on."""
        return self.fail > 0.0 or self.corrupt > 0.0 or self.latency > 0 or self.raise_ > 0.0 or self.brownout > 0.0

    def to_json(self) -> dict[str, float | int]:
        return {"fail": self.fail, "corrupt": self.corrupt, "latency": self.latency, "raise": self.raise_,
                "brownout": self.brownout}


def parse_faults(text: str) -> FaultPlan:
    """``fail=P,corrupt=P,latency=N,raise=P,brownout=S`` (any subset, each once) -> a FaultPlan.

    P is a probability in [0, 1], N an int >= 0, S a number of seconds >= 0. Anything else raises
    :class:`FaultSpecError` naming the item.
    """
    values: dict[str, float | int] = {}
    if not text.strip():
        raise FaultSpecError(
            f"--faults is empty; give NAME=VALUE items among {', '.join(FAULT_KINDS)}", item=text
        )
    for raw in text.split(","):
        item = raw.strip()
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not item:
            raise FaultSpecError(f"--faults {text!r} has an empty item", item=item)
        if not sep or not name or not value:
            raise FaultSpecError(f"--faults item {item!r} is not NAME=VALUE", item=item)
        if name not in FAULT_KINDS:
            raise FaultSpecError(
                f"--faults item {item!r}: unknown fault {name!r}; known: {', '.join(FAULT_KINDS)}", item=item
            )
        if name in values:
            raise FaultSpecError(f"--faults item {item!r}: {name!r} is given twice", item=item)
        if name == "latency":
            if not value.isdecimal():
                raise FaultSpecError(
                    f"--faults item {item!r}: latency must be a whole number of steps >= 0", item=item
                )
            values[name] = int(value)
            continue
        if name == "brownout":
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and 0.0 <= seconds <= 3600.0):
                raise FaultSpecError(
                    f"--faults item {item!r}: brownout must be a number of seconds between 0 and 3600", item=item
                )
            values[name] = seconds
            continue
        try:
            prob = float(value)
        except ValueError:
            prob = math.nan
        if not 0.0 <= prob <= 1.0:  # NaN fails this too
            raise FaultSpecError(
                f"--faults item {item!r}: {name} must be a probability between 0 and 1", item=item
            )
        values[name] = prob
    return FaultPlan(
        fail=float(values.get("fail", 0.0)),
        corrupt=float(values.get("corrupt", 0.0)),
        latency=int(values.get("latency", 0)),
        raise_=float(values.get("raise", 0.0)),
        brownout=float(values.get("brownout", 0.0)),
    )


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How a run behaves. ``steps`` and ``seconds`` bound it (whichever comes first; at least one).

    Workload sizes left at ``None`` are derived from the primary's slot count,
    so that the live requests' blocks fit in it with room to evict.
    """

    steps: int | None = 1000
    seconds: float | None = None
    seed: int = 0
    faults: FaultPlan = FaultPlan()
    window: int = count(2)  # blocks, for the requests that use the sliding-window scan
    window_share: float = share(0.25)
    max_live_requests: int | None = optional_count()
    max_prompt_blocks: int | None = optional_count()
    system_prompts: int = count(4)
    history: int = count(64)  # finished conversations kept for multi-turn continuations
    continue_share: float = share(0.5)
    store_failure_rate: float = share(0.03)
    max_failure_share: float = share(0.05)  # of a secondary's jobs, failed or timed out, before the run is not clean
    late_store_rate: float = share(0.3)
    cancel_rate: float = share(0.01)
    stuck_steps: int = count(64)
    stuck_seconds: float = non_negative(1.0)
    step_sleep_s: float = non_negative(0.0)
    drain_steps: int = count(64)  # at the end, wait for jobs in flight this many steps and drain_seconds at least
    drain_seconds: float = non_negative(5.0)
    progress_interval_s: float = non_negative(0.1)

    def __post_init__(self) -> None:
        if self.steps is None and self.seconds is None:
            raise ConfigurationError("SimConfig: give steps, seconds or both")
        if self.steps is not None and (type(self.steps) is not int or self.steps < 1):
            raise ConfigurationError(f"SimConfig: steps must be an int >= 1, got {self.steps!r}")
        seconds: object = self.seconds  # checked at run time: a caller may pass anything
        if seconds is not None and not (
            isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0
        ):
            raise ConfigurationError(f"SimConfig: seconds must be a number > 0, got {self.seconds!r}")
        check_fields(self, "SimConfig: ")

