"""What a finished, stopped or diverged run amounts to: pure rules over the Trainer's numbers, so that the job
(train/run/job.py), the logs and their tests share one answer."""

from __future__ import annotations

import math
from typing import Any, Protocol

from train.common.console import warn
from train.common.errors import ConfigError
from train.outputs.runfiles import RunFiles
from train.report import write_report

PERPLEXITY_MAX_LOSS = 700.0  # exp(loss) overflows a float above ~709: the perplexity of a worse loss is inf


class DataCounts(Protocol):
    """What the final metrics need of the corpus (train/data's Corpus): its counts, None where a stream's are not
    known before it is read."""

    # read-only, as a frozen dataclass's fields are
    @property
    def streaming(self) -> bool: ...
    @property
    def train_samples(self) -> int | None: ...
    @property
    def train_real_tokens(self) -> int | None: ...
    @property
    def eval_samples(self) -> int: ...


def perplexity(eval_loss: float) -> float:
    return math.exp(eval_loss) if eval_loss < PERPLEXITY_MAX_LOSS else math.inf


def evaluation_at(log_history: list[dict[str, Any]], step: int) -> dict[str, Any] | None:
    """The eval_* metrics of an evaluation the Trainer logged at ``step``, when it is the newest one: the final
    weights' evaluation need not run twice. None when the newest evaluation is older (or there is none)."""
    for entry in reversed(log_history):
        if "eval_loss" in entry:
            if entry.get("step") == step:
                return {k: v for k, v in entry.items() if k.startswith("eval_")}
            return None
    return None


def real_tokens_per_second(
    tokens: int, seconds: float, samples_per_second: float, tokens_per_sample: float | None
) -> float | None:
    """Real (non-padding) tokens per second: counted tokens over time where the Trainer counted any, else
    samples per second times the real tokens of an average sample (counting turned off); None when neither is
    known (a stream without a count)."""
    if tokens > 0:
        return tokens / seconds if seconds > 0 else 0.0
    if tokens_per_sample:
        return samples_per_second * tokens_per_sample
    return None


def divergence_message(
    step: int, what: str, kept_checkpoint: str | None, learning_rate: float, refusal: str = ""
) -> str:
    """The one line a diverged run ends with: where, why, why it was not rolled back (``refusal``, from
    train/run/rollback.py), what is kept and what to change."""
    kept = f"the last good checkpoint, {kept_checkpoint}, is kept" if kept_checkpoint else "no checkpoint was saved"
    tried = f"; {refusal}" if refusal else ""
    return (
        f"training diverged at step {step} ({what}){tried}: final/ was not written and {kept}; lower "
        f"learning_rate (now {learning_rate:g}) or add warmup_steps, and start over with MLM_RESUME=never (a "
        "resumed optimizer keeps the old learning rate)"
    )


def session_rates(metrics: dict[str, Any], *, full_steps: float, steps: int, global_batch: int) -> dict[str, float]:
    """The Trainer's ``train_samples_per_second`` and ``train_steps_per_second`` as this session ran them: ``steps``
    optimizer steps, ``full_steps`` of them counted in full batches (a batch warm-up's steps their share) of
    ``global_batch`` rows, over its ``train_runtime``. The Trainer divides what it planned when training began (its
    max_steps' rows, or the epochs') by the runtime (transformers 5.25, ``speed_metrics``): a time budget's plan, a
    stop or a resume made those figures of steps that never ran (40,000 samples at 546.7/s where 5,312 rows were
    trained at 72.6/s). A last short batch of an epoch counts whole."""
    runtime = metrics.get("train_runtime") or 0.0
    if runtime <= 0 or steps <= 0:
        return {}
    return {
        "train_samples_per_second": round(full_steps * global_batch / runtime, 3),
        "train_steps_per_second": round(steps / runtime, 3),
    }


def final_metrics(
    metrics: dict[str, Any], *, tokens_this_session: int, tokens_in_all: int, corpus: DataCounts, world_size: int
) -> dict[str, Any]:
    """all_results.json: the Trainer's summary and final evaluation (``metrics``), real tokens per second of this
    session, the perplexity and the counts. ``tokens_this_session``: what the Trainer counted since this process
    started training; ``tokens_in_all``: its count since step 0 (a resumed run's included). ``eval_samples`` is
    what the final evaluation read (a time budget's sample of the held-out set: its loss is that sample's), the
    held-out set's size where there was no evaluation."""
    samples, real = corpus.train_samples, corpus.train_real_tokens
    tokens_per_sample = real / max(samples, 1) if samples and real is not None else None
    runtime = metrics.get("train_runtime") or 0.0
    rate = real_tokens_per_second(
        tokens_this_session, runtime, metrics.get("train_samples_per_second", 0.0), tokens_per_sample
    )
    out = {**metrics, "train_tokens_per_second": rate if runtime and rate is not None else 0.0}
    if tokens_this_session > 0 or corpus.streaming:
        out["num_input_tokens_seen"] = tokens_in_all
    if "eval_loss" in out:
        out["perplexity"] = perplexity(out["eval_loss"])
    out.update(
        world_size=world_size, train_samples=samples, eval_samples=metrics.get("eval_samples", corpus.eval_samples)
    )
    return out


def write_report_safely(files: RunFiles) -> None:
    """The report is a convenience: failing to draw it must not fail a finished or preempted run."""
    try:
        write_report(files.root)
    except ConfigError:
        return  # stopped before its first log step: nothing to draw yet
    except Exception as exc:  # noqa: BLE001 - any drawing failure is only a warning
        warn(f"no report ({type(exc).__name__}: {exc}); try: entrypoint.sh report {files.root}")
