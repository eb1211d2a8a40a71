"""A rollback as run.json records it (written by train/run/rollback.py), and in words for the report, the model card
and the trackers, which read run.json as data. Pure, without torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RollbackRecord:
    """One rollback: when it was made, the step whose log showed the divergence and what it was (``detected``: its
    kind, ``what``: in words), the checkpoint trained again from, the steps whose batches were skipped (first,
    last), those batches per rank, and the factor on the peak learning rate."""

    time: str
    detected_at_step: int
    detected: str
    what: str
    rolled_back_to: str
    skipped_steps: tuple[int, int]
    batches_skipped_per_rank: int
    learning_rate_factor: float

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "skipped_steps": list(self.skipped_steps)}

    @classmethod
    def of(cls, entry: Any) -> RollbackRecord | None:
        """One of run.json's ``rollbacks``, read as data: None where it is not one."""
        try:
            first, last = entry["skipped_steps"]
            return cls(str(entry["time"]), int(entry["detected_at_step"]), str(entry["detected"]), str(entry["what"]),
                       str(entry["rolled_back_to"]), (int(first), int(last)), int(entry["batches_skipped_per_rank"]),
                       float(entry["learning_rate_factor"]))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None

    def words(self) -> str:
        rate = f", peak learning rate x{self.learning_rate_factor:g}" if self.learning_rate_factor != 1.0 else ""
        first, last = self.skipped_steps
        back = f"back to {self.rolled_back_to}, steps {first}-{last} skipped"
        return f"step {self.detected_at_step} ({self.what}): {back}{rate}"


def rollbacks_of(recorded: Any) -> list[RollbackRecord]:
    """The rollbacks of run.json's ``rollbacks`` (``{"limit", "made", "rollbacks": [...]}``) that read as such."""
    entries = recorded.get("rollbacks") if isinstance(recorded, dict) else None
    found = [RollbackRecord.of(e) for e in entries] if isinstance(entries, list) else []
    return [r for r in found if r is not None]


def rollback_words(recorded: Any) -> str | None:
    """run.json's ``rollbacks`` in words: "none", or each in turn; None where the run recorded none (a run.json
    from before they were recorded)."""
    if not isinstance(recorded, dict):
        return None
    return "; ".join(r.words() for r in rollbacks_of(recorded)) or "none"
