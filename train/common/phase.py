"""Which phase of a phased run a launch trains (train/config/phases.py), as the launcher hands it to the ranks
(``Handoff.phase``) and the banner, run.json, the checkpoints and the report show it. In common/: the launcher
writes it, the ranks and the report read it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class PhaseFacts:
    index: int  # 0-based
    count: int  # the plan's phases
    name: str
    start: int  # the step the phase starts after (the previous phase's last)
    end: int  # its last step: the run's max_steps while it trains
    total: int  # the whole plan's steps: the learning-rate schedule's length
    decay_steps: int | None  # warmup_stable_decay's decay: the steps of the phases marked decay (None: decay_ratio)

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def line(self) -> str:
        return f"phase {self.index + 1}/{self.count} {self.name}: steps {self.start + 1}-{self.end} of {self.total}"

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, data: Any) -> PhaseFacts | None:
        """The facts of a hand-off's or a record's ``phase`` (None for none, or one not as the launcher writes it)."""
        if not isinstance(data, dict):
            return None
        try:
            facts = cls(**data)
        except TypeError:
            return None
        counts = (facts.index, facts.count, facts.start, facts.end, facts.total)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
            return None
        return facts if 0 <= facts.index < facts.count and 0 <= facts.start < facts.end <= facts.total else None
