"""The result every benchmark reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["BenchResult"]


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
