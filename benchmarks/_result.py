"""The result every benchmark reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["BenchResult", "record_round"]


@dataclass(frozen=True, slots=True)
class BenchResult:
    """One benchmark's headline ratio against its target, plus every figure measured.

    ``lower_is_better`` says which side of ``target`` passes: a cost ratio
    (ours / baseline time) passes at or below it, a throughput ratio at or
    above it.
    """

    name: str
    ratio: float
    target: float
    lower_is_better: bool
    summary: str
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.ratio <= self.target if self.lower_is_better else self.ratio >= self.target

    def to_json(self) -> dict[str, object]:
        """Every field (``figures`` copied), plus the verdict ``passed``."""
        return {**asdict(self), "passed": self.passed}


def record_round(
    figures: dict[str, float],
    rep: int,
    unit: str,
    amount: float,
    ours: tuple[float, float],
    raw: tuple[float, float],
) -> tuple[float, float]:
    """Record one side-by-side round of stores and loads: ``{side}_{store|load}_{unit}_{rep}`` =
    ``amount`` / seconds for ``ours`` and ``raw`` (each ``(store s, load s)``). Returns the round's
    ``(store, load)`` ratios, ours' throughput over raw's (raw seconds / ours seconds)."""
    for side, (store_s, load_s) in (("ours", ours), ("raw", raw)):
        figures[f"{side}_store_{unit}_{rep}"] = amount / store_s
        figures[f"{side}_load_{unit}_{rep}"] = amount / load_s
    return raw[0] / ours[0], raw[1] / ours[1]
