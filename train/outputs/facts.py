"""The run's facts: what a rank learnt preparing the run (the data's size, the model that ran, the masking, the
layout, the sharding), built once (train/run/build.py ``Prepared.facts``) and read by attribute by the banner, the
logs and run.json (train/outputs/record.py). Each part turns into its JSON with :func:`dataclasses.asdict`, so
run.json and the banner record keep their keys."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelFacts:
    """run.json's ``model``: what ran."""

    attention: str | None = None  # transformers' choice of attention (or MLM_ATTN_IMPLEMENTATION)
    head: str | None = None  # the head the loss went through: masked-only or dense
    head_weights: str | None = None  # what the pretrained weights lacked of the head, or None


@dataclass(frozen=True)
class Masking:
    """run.json's ``masking``: the rates set, and the share of real tokens masked on samples drawn at random."""

    mlm_probability: float
    eval_mlm_probability: float
    whole_word_mask: bool
    realised: float | None  # None for a stream without evaluation samples (at the first step's rate)
    realised_on_samples: int
    final_mlm_probability: float | None = None  # the training rate at the end of a rate schedule


@dataclass(frozen=True)
class Packing:
    """run.json's ``packing``: the padding mode, whether documents are kept apart, real tokens per position."""

    padding: str
    documents_apart: bool
    efficiency: float | None


@dataclass(frozen=True)
class Sharding:
    """The mode the rank trains with and why (run.json's ``sharding`` until every rank's bytes are measured)."""

    mode: str  # ddp or fsdp
    choice: str  # the mode and why, with DDP's memory estimate
    ddp_estimate: dict[str, int] | None  # that estimate (train/model/memory.py), as plan shows it


@dataclass(frozen=True)
class RunFacts:
    """What only the running job knows about its data and model (None where a stream does not know it yet)."""

    dataset_fingerprint: str  # names the raw data
    # What identifies the data as read (train/data/identity.py), and what changed since the checkpoint a run
    # resumed from when MLM_RESUME_ON_CHANGED_DATA let it go on.
    data_identity: dict[str, dict[str, Any]] | None = None
    resumed_on_changed_data: list[str] | None = None
    train_samples: int | None = None
    eval_samples: int | None = None
    train_documents: int | None = None  # the rows of text the samples came from (packing makes blocks of them)
    eval_documents: int | None = None
    train_real_tokens: int | None = None
    truncation: dict[str, int] | None = None  # examples_cut, tokens_cut: what max_seq_length dropped
    model: ModelFacts = ModelFacts()
    masking: Masking | None = None
    packing: Packing | None = None
    resumed_from_ranks: int | None = None  # the ranks that saved the checkpoint this run resumes from
    sharding: Sharding | None = None
    outputs: str | None = None  # where the outputs live, in words (the output location's summary)
    mixture: list[dict[str, Any]] | None = None  # a mixture's sources: shares asked and had (train/data/mixture.py)
    branch: dict[str, Any] | None = None  # a branch's parent checkpoint and step (train/outputs/branch.py)
    phase: dict[str, Any] | None = None  # a phased run's phase this launch trained (train/common/phase.py)
    batch_warmup: dict[str, Any] | None = None  # a growing global batch (train/common/schedules.py BatchWarmup)

    @property
    def tokens_per_sample(self) -> float | None:
        """The training data's average real tokens per sample (tokens/s without the Trainer's count)."""
        if self.train_samples and self.train_real_tokens:
            return self.train_real_tokens / self.train_samples
        return None


def as_json(part: Any) -> dict[str, Any] | None:
    """A part of the facts as its JSON object (None stays None)."""
    return None if part is None else asdict(part)
