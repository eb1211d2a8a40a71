"""What a person (or a log collector) sees while the job runs: the launch banner, one record per log step, and
``output_dir/logs/`` (``train.jsonl`` and TensorBoard events).

Every record is appended to ``output_dir/logs/train.jsonl`` whatever the console format, so the report can be
built from any run, finished or not. On the console, ``log_format`` picks readable lines under the Trainer's
progress bar (``text``) or one JSON object per line on stdout and no progress bar (``json``); ``auto`` means text on
a terminal. Only the world's rank 0 prints and writes.

Record kinds (the ``event`` key): ``banner`` (each start, resumes included), ``train`` (each log step), ``eval``,
``train_end`` (the Trainer's summary), and ``checkpoint`` (each save: its size and what the save and its digests
took; train.jsonl only, written by train/run/callbacks.py).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback

from train.common.console import jsonable, now, resolve_format
from train.common.handoff import Handoff, global_batch
from train.common.schedules import full_steps_between
from train.machine.sampler import Sampler
from train.outputs.facts import RunFacts
from train.outputs.runfiles import RunFiles
from train.run.banner import TrainStart
from train.run.diagnostics import StepClock
from train.run.outcome import perplexity, real_tokens_per_second
from train.run.startup import FIRST_STEP, STARTUP_EVENT, Startup, startup_text

if TYPE_CHECKING:
    from transformers import Trainer, TrainingArguments

MIB = 1024 * 1024


def append_record(output_dir: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON line; opened per record so a crash leaves every earlier line intact."""
    path = RunFiles(output_dir).train_jsonl
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(jsonable(record), sort_keys=False) + "\n")


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


# ---- per-step records ----------------------------------------------------------------------------------------------


def _text_line(record: dict[str, Any]) -> str:
    """One readable line per record (the JSON record carries the same values, unrounded)."""
    clock = str(record.get("time", ""))[11:19]
    event = record["event"]
    if event == "train":
        parts = [f"step {record['step']}/{record.get('max_steps') or '?'}", f"epoch {record.get('epoch') or 0:.2f}"]
        if "loss" in record:
            parts.append(f"loss {_float(record['loss'], '.4f')}")
        if "learning_rate" in record:
            parts.append(f"lr {_float(record['learning_rate'], '.2e')}")
        if "grad_norm" in record:
            parts.append(f"grad {_float(record['grad_norm'], '.3g')}")
        if "mlm_probability" in record:  # a mask rate schedule's rate at this step
            parts.append(f"masking {record['mlm_probability']:.1%}")
        if "batch_rows" in record:  # a batch warm-up's global batch at this step
            parts.append(f"batch {record['batch_rows']}")
        if record.get("tokens_per_second") is not None:
            parts.append(f"{record['tokens_per_second']:,.0f} tok/s")
        if record.get("samples_per_second") is not None:
            parts.append(f"{record['samples_per_second']:,.1f} samples/s")
        if record.get("mfu") is not None:  # where the time went (train/run/diagnostics.py)
            parts.append(f"mfu {record['mfu']:.1%}")
        if record.get("data_wait_share") is not None:
            parts.append(f"data wait {record['data_wait_share']:.0%}")
        for gpu in record.get("gpus", []):
            parts.append(
                f"gpu{gpu['index']} {gpu['util_pct']}% {gpu['mem_used_mib'] / 1024:.1f}/"
                f"{gpu['mem_total_mib'] / 1024:.0f} GiB"
            )
        parts.append(f"elapsed {_duration(record.get('elapsed_s'))} eta {_duration(record.get('eta_s'))}")
        return f"[{clock}] " + " | ".join(parts)
    if event == "eval":
        return f"[{clock}] {_eval_text(record)}"
    if event == STARTUP_EVENT:
        return f"[{clock}] {startup_text(record)}"
    skip = {"event", "time", "step", "epoch"}
    values = [f"{k} {_float(v, '.4g')}" for k, v in record.items() if k not in skip and not isinstance(v, (list, dict))]
    return f"[{clock}] {event} step {record.get('step', '?')} | " + " | ".join(values)


# The eval_* metrics an evaluation's line says in its own words, or leaves out (its speed, which is not training's);
# the JSON record and train.jsonl carry every key, the quality curve's (tokens seen, times) too.
_EVAL_WORDED = {"eval_loss", "eval_accuracy", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}


def _eval_text(record: dict[str, Any]) -> str:
    """``eval at step 40: loss 5.2100, perplexity 183.1, masked accuracy 0.112 (12.3 s)``: the Trainer's eval_*
    metrics in words (its accuracy is over the masked tokens: train/run/build.py masked_accuracy), any other
    eval_* metric after them by its name."""
    parts: list[str] = []
    loss = record.get("eval_loss")
    if isinstance(loss, (int, float)):
        parts.append(f"loss {loss:.4f}")
        if math.isfinite(loss):
            ppl = perplexity(loss)  # a diverged loss's is 50 digits long: an exponent then
            parts.append(f"perplexity {ppl:.1f}" if ppl < 1e6 else f"perplexity {ppl:.3g}")
    if isinstance(record.get("eval_accuracy"), (int, float)):
        parts.append(f"masked accuracy {record['eval_accuracy']:.3f}")
    for key, value in record.items():
        if key.startswith("eval_") and key not in _EVAL_WORDED:
            parts.append(f"{key.removeprefix('eval_').replace('_', ' ')} {_float(value, '.4g')}")
    runtime = record.get("eval_runtime")
    took = f" ({runtime:.1f} s)" if isinstance(runtime, (int, float)) else ""
    return f"eval at step {record.get('step', '?')}: {', '.join(parts) or 'no metrics'}{took}"


def _float(value: Any, spec: str) -> str:
    if isinstance(value, (int, float)):
        return format(value, spec)
    return str(value)


class TrainingLog(StepClock):
    """On rank 0: a record per log step, evaluation and summary, to ``train.jsonl`` and the console.

    Throughput is measured between consecutive step ends, leaving out the time spent evaluating and saving, so it
    shows training speed (data loading included). Real tokens per second come from the Trainer's exact count when
    ``include_num_input_tokens_seen`` is on, otherwise from the dataset's average real tokens per sample (the
    ``facts``' ``tokens_per_sample``, which the job knows from tokenization). ``banner``: the launch banner's record
    and text once the Trainer says where training starts (train/run/banner.py ``banner``, the configuration, facts
    and handoff bound); None: no banner.
    """

    startup: Startup | None = None  # the start-up's phases, said and recorded once, at the session's first step
    # The steps after a step up to another in full steps (MLMTrainer.steps_cost: a batch warm-up's cost less): what
    # the ETA counts in; attach() sets it, one full step a step where no trainer is attached.
    steps_cost: Callable[[int, int], float] | None = None

    def __init__(
        self,
        output_dir: str | Path,
        log_format: str,
        facts: RunFacts | None = None,
        banner: Callable[[TrainStart], tuple[dict[str, Any], str]] | None = None,
        stream: TextIO | None = None,
        handoff: Handoff | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.log_format = log_format
        self.tokens_per_sample = facts.tokens_per_sample if facts is not None else None
        self.facts = facts
        self.banner = banner
        self.stream = stream
        self.handoff = handoff
        self.gpus = Sampler(handoff.gpu_uuids if handoff else [])
        super().__init__()
        self._started: float | None = None
        self._start_step = 0
        self._busy = 0.0
        self._trained_s = 0.0  # training time of this session, evaluations and saves left out
        self._steps_timed = 0
        self._tokens_at_mark = 0
        self.curve: list[dict[str, Any]] = []  # each evaluation against time and tokens: run.json's quality_curve

    # -- output --
    def _emit(self, record: dict[str, Any]) -> None:
        append_record(self.output_dir, record)
        stream = self.stream or sys.stdout
        if self.log_format == "json":
            print(json.dumps(jsonable(record)), file=stream, flush=True)
        else:
            _write_line(_text_line(record), stream)

    # -- Trainer events --
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.startup is not None:
            self.startup.mark("to training")  # the run's record and callbacks, the Trainer's own set-up
        super().on_train_begin(args, state, control, **kwargs)
        self._started = time.monotonic()
        self._start_step = state.global_step
        self._tokens_at_mark = state.num_input_tokens_seen or 0
        if not state.is_world_process_zero:
            return
        self.gpus.start()
        if self.banner is not None:
            start = TrainStart(max_steps=state.max_steps, world_size=args.world_size, start_step=state.global_step)
            record, text = self.banner(start)
            append_record(self.output_dir, record)
            print(text, file=self.stream or sys.stdout, flush=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.startup is not None:
            self.startup.mark(FIRST_STEP)
            if state.is_world_process_zero:
                self._emit({**self.startup.record(), "time": now()})
            self.startup = None
        super().on_step_end(args, state, control, **kwargs)

    def step_took(self, seconds: float) -> None:
        self._busy += seconds
        self._trained_s += seconds
        self._steps_timed += 1

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        logs = dict(logs)
        base = {"time": now(), "step": state.global_step, "epoch": logs.pop("epoch", state.epoch)}
        if any(key.startswith("eval_") for key in logs):
            point = self._quality_point(state, logs)
            self.curve.append(point)
            self._emit({"event": "eval", **base, **logs, **point})
            self._restart()
        elif "train_loss" in logs:  # the Trainer's summary when train() ends
            self._emit({"event": "train_end", **base, **logs})
        else:
            # While it counts tokens the Trainer adds its run-so-far averages (train_runtime, train_*_per_second)
            # to every step's logs; this record has elapsed_s and the rates over the last interval instead.
            for key in [k for k in logs if k.startswith("train_")]:
                del logs[key]
            speed = self._speed(args, state, logs.get("batch_rows"))
            self._emit({"event": "train", **base, "max_steps": state.max_steps, **logs, **speed})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.gpus.stop()

    # -- measurements --
    def _quality_point(self, state: Any, logs: dict[str, Any]) -> dict[str, Any]:
        """An evaluation as a point of quality against time: the held-out loss, the wall time since the launch
        (start-up included, as a user waits for it), this session's training time, and the tokens seen."""
        launched = self.handoff.launched_at if self.handoff else None
        point: dict[str, Any] = {"step": state.global_step, "eval_loss": logs.get("eval_loss")}
        if "eval_encoder_cosine" in logs:  # how far an adapted encoder moved (train/run/adapting.py)
            point["eval_encoder_cosine"] = logs["eval_encoder_cosine"]
        if launched is not None:
            point["since_launch_s"] = round(time.time() - launched, 2)
        point["train_s"] = round(self._trained_s, 2)
        if state.num_input_tokens_seen:
            point["tokens_seen"] = int(state.num_input_tokens_seen)
        return point

    def _speed(self, args: Any, state: Any, rows: int | None = None) -> dict[str, Any]:
        """The interval's rates, elapsed time and ETA; ``rows``: a batch warm-up's global batch at the logged step
        (the steps of the interval taken as its size)."""
        now = time.monotonic()
        out: dict[str, Any] = {}
        if self._busy > 0 and self._steps_timed:
            batch = rows or global_batch(
                args.per_device_train_batch_size, args.world_size, args.gradient_accumulation_steps
            )
            samples_per_second = self._steps_timed * batch / self._busy
            out["samples_per_second"] = round(samples_per_second, 3)
            tokens_seen = state.num_input_tokens_seen or 0
            counted = max(tokens_seen - self._tokens_at_mark, 0)
            rate = real_tokens_per_second(counted, self._busy, samples_per_second, self.tokens_per_sample)
            if rate is not None:
                out["tokens_per_second"] = round(rate, 1)
            self._tokens_at_mark = tokens_seen
        self._busy, self._steps_timed = 0.0, 0
        if self._started is not None:
            elapsed = now - self._started
            cost = self.steps_cost or (lambda start, end: full_steps_between(None, start, end, 0))
            done = cost(self._start_step, state.global_step)
            out["elapsed_s"] = round(elapsed, 1)
            if done > 0 and state.max_steps:
                eta = elapsed / done * cost(state.global_step, state.max_steps)
                deadline = self.handoff.deadline if self.handoff else None
                if deadline is not None:  # a time budget ends the run by then, whatever the steps before its plan say
                    eta = min(eta, max(deadline - time.time(), 0.0))
                out["eta_s"] = round(eta, 1)
        gpus = self.gpus.sample()
        if gpus:
            out["gpu_util_pct"] = round(sum(g["util_pct"] for g in gpus) / len(gpus), 1)
            out["gpu_mem_used_mib"] = max(g["mem_used_mib"] for g in gpus)
            out["gpus"] = gpus
        return out


def _write_line(line: str, stream: TextIO) -> None:
    """Print above the progress bar (tqdm redraws it below) rather than through it."""
    try:
        from tqdm.auto import tqdm

        tqdm.write(line, file=stream)
        stream.flush()
    except ImportError:
        print(line, file=stream, flush=True)


class QuietProgress(ProgressCallback):
    """The Trainer's progress bar without its printing of each log dict (our own lines replace it)."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        return None


# ---- wiring ------------------------------------------------------------------------------------------------------


def bars_drawn(log_format: str) -> bool:
    """The Trainer's progress bar only in text mode on a terminal: it redraws its line with carriage returns between
    our step lines, which in a captured log (a file, ``kubectl logs``, Slurm's output) glue the bar's last state to
    the next step line."""
    try:
        return log_format == "text" and sys.stderr.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def configure_console(log_format: str) -> str:
    """Resolve the console format; for JSON, silence the progress bars datasets, transformers and the hub draw on
    stderr (tokenizing, downloading, saving), so the output is JSON lines and real warnings. In text they stay, on
    a terminal or not: they end before training with a line of their own (what a captured log shows of a node's
    tokenizing); only the Trainer's bar, redrawn between the step lines, needs a terminal (:func:`bars_drawn`).
    Call once, early."""
    log_format = resolve_format(log_format)
    if log_format == "json":
        import datasets
        import huggingface_hub.utils
        from transformers.utils import logging as hf_logging

        datasets.disable_progress_bars()
        hf_logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
    return log_format


def callbacks(
    training: TrainingArguments,
    log_format: str,
    facts: RunFacts | None = None,
    handoff: Handoff | None = None,
    startup: Startup | None = None,
    banner: Callable[[TrainStart], tuple[dict[str, Any], str]] | None = None,
) -> list[TrainerCallback]:
    """Our logging callbacks for this rank, its log first. ``facts``: what the job's data preparation counted
    (train_samples, eval_samples, train_real_tokens, ...); without them tokens/s needs the Trainer's count.
    ``startup``: the start-up's phases, recorded at the first step; ``banner``: :class:`TrainingLog`'s."""
    log_format = resolve_format(log_format)
    log = TrainingLog(training.output_dir, log_format, facts=facts, banner=banner, handoff=handoff)
    log.startup = startup
    found: list[TrainerCallback] = [log]
    if bars_drawn(log_format) and not training.disable_tqdm:
        found.append(QuietProgress())
    return found


def attach(trainer: Trainer, added: list[TrainerCallback]) -> TrainingLog:
    """Replace the Trainer's console output with ours (``added``: :func:`callbacks`) and route TensorBoard events
    to the log's ``output_dir/logs``; the log (whose evaluations run.json keeps as the quality curve).

    The Trainer always installs either a progress bar that also prints each log dict to stdout, or (with
    ``disable_tqdm``) a printer of those dicts; both would interleave with our JSON lines, so both go.
    """
    log = added[0]
    assert isinstance(log, TrainingLog)
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    for callback in added:
        trainer.add_callback(callback)
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        # TENSORBOARD_LOGGING_DIR, when set, already chose the directory; otherwise the Trainer would pick runs/<date>
        if isinstance(callback, TensorBoardCallback) and callback.logging_dir is None:
            callback.logging_dir = str(RunFiles(log.output_dir).logs)
    log.steps_cost = getattr(trainer, "steps_cost", None)
    return log
