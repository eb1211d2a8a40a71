"""What the job does to output_dir: an atomic ``final/``, atomic JSON files, ``run.json``'s facts, the checks that
keep earlier work safe (a finished ``final/`` is never replaced unless asked), and telling a full disk from other
write failures. The names are train/outputs/runfiles.py's; which checkpoint a run resumes from is
train/outputs/checkpoints.py."""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from train.common.console import now, warn
from train.common.distributed import is_world_zero
from train.common.errors import ConfigError, EnvironmentProblem
from train.common.handoff import Handoff
from train.common.hf import cache_root, hf_home
from train.config import Config
from train.outputs.checkpoints import resume_choice
from train.outputs.runfiles import RunFiles

WRITE_PROBE_BYTES = 1 << 20
LOW_SPACE_BYTES = 16 * 2**20  # a write that failed with less free than this failed for want of space


def probe_write(directory: Path) -> None:
    """Write and remove a file of real bytes in ``directory``: on a full device creating an empty file still
    succeeds. Raises OSError; nothing is left behind either way."""
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-") as probe:
        probe.write(b"\0" * WRITE_PROBE_BYTES)
        probe.flush()
        os.fsync(probe.fileno())


def write_failure(exc: OSError) -> str:
    """Why a write failed, in words (ENOSPC named: the fix differs)."""
    return "no space left on the device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)


def refuse_finished(config: Config) -> None:
    """A finished ``final/`` is replaced only when asked (ConfigError otherwise)."""
    files = RunFiles(config.training.output_dir)
    if files.final.exists() and not config.job.overwrite_output_dir:
        raise ConfigError(
            f"{config.source_of('output_dir')}={str(files.root)!r}: holds a finished model in {files.final.name}/; set "
            "MLM_OVERWRITE_OUTPUT_DIR=true to replace it, or choose another output_dir"
        )


def check_output_dir(config: Config, dry_run: bool = False) -> RunFiles:
    """Fail early, before any work: output_dir must be writable and must not hold a finished run to overwrite
    (a dry run, ``plan``, reports a finished run as a fact instead: see :func:`output_facts`)."""
    files = RunFiles(config.training.output_dir)
    try:
        files.root.mkdir(parents=True, exist_ok=True)
        probe_write(files.root)
    except OSError as exc:
        message = f"{config.source_of('output_dir')}={str(files.root)!r}: not writable ({write_failure(exc)}); "
        raise EnvironmentProblem(message + "expected a writable directory") from None
    if config.output_store:  # the store holds the run: its checks, not the staging directory's
        from train.outputs.mirror import Mirror  # imports the Trainer's callback class: only a store's run needs it

        Mirror(config).check(dry_run)
    elif not dry_run:
        refuse_finished(config)
    return files


def output_facts(config: Config) -> dict[str, Any]:
    """What a run would find in output_dir: a finished model (which it refuses to replace unless asked) and the
    checkpoint it would resume from, with the newer ones it would skip and why."""
    if config.output_store:
        from train.outputs.mirror import Mirror

        return Mirror(config).facts()
    files = RunFiles(config.training.output_dir)
    chosen, skipped = resume_choice(config)
    finished = files.final.exists()
    try:
        refuse_finished(config)
        refusal = None
    except ConfigError:
        refusal = "refuse: it holds a finished model (MLM_OVERWRITE_OUTPUT_DIR=true replaces it)"
    return {
        "dir": str(files.root),
        "finished_model": finished,
        "a run would": (
            refusal
            or ("start over from step 0, replacing the finished model at its end" if finished else None)
            or (f"resume from {chosen.name}" if chosen else "start from step 0")
        ),
        "skipped_checkpoints": {path.name: reason for path, reason in skipped},
    }


def check_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Our cache inside HF_HOME must be writable: tokenized data and trained tokenizers are written there."""
    root = cache_root(environ)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe_write(root)
    except OSError as exc:
        raise EnvironmentProblem(
            f"HF_HOME={str(hf_home(environ))!r}: not writable ({write_failure(exc)}); mount a writable volume there "
            "or point HF_HOME at one (the job caches tokenized data in it)"
        ) from None
    return root


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def publish_final(files: RunFiles, write: Callable[[Path], None]) -> Path:
    """Write the final model into a temporary directory, then rename it into place.

    A crash at any point leaves either no ``final/`` or the previous one whole, never a partial one.
    """
    final, staging = files.final, files.final_staging
    shutil.rmtree(staging, ignore_errors=True)  # left over by a crashed run
    staging.mkdir(parents=True)
    write(staging)
    if final.exists():
        retired = files.final_retired(os.getpid())
        os.replace(final, retired)
        os.replace(staging, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, final)
    shutil.rmtree(files.final_previous, ignore_errors=True)  # a replaced run's model, kept until now
    return final


def start_over(config: Config, warn: Callable[[str], None]) -> bool:
    """MLM_OVERWRITE_OUTPUT_DIR=true on a finished run: this run starts from step 0.

    The finished model is kept, renamed ``final.previous/``, until this run publishes its own, and the finished
    run's checkpoints are removed (resuming from them would train 0 steps). Once started over there is no
    ``final/``: a preempted restart with the same options resumes its own checkpoints instead of starting again.
    Call it in one process only (world rank 0), before the resume decision.
    """
    files = RunFiles(config.training.output_dir)
    if not (config.job.overwrite_output_dir and files.final.exists()):
        return False
    shutil.rmtree(files.final_previous, ignore_errors=True)
    os.replace(files.final, files.final_previous)
    old = files.checkpoints() if config.job.resume in ("auto", "never") else []  # an explicit path is kept
    for checkpoint in old:
        shutil.rmtree(checkpoint)
    warn(
        f"{config.source_of('overwrite_output_dir')}=true: starting over; the finished model is kept in "
        f"{files.final_previous.name}/ until this run's final/ replaces it, and its {len(old)} checkpoint(s) were "
        "removed"
    )
    return True


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("torch", "transformers", "datasets", "accelerate", "tokenizers", "nvidia-ml-py"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def hardware(world_size: int, handoff: Handoff | None) -> dict[str, Any]:
    """The machine, and the GPUs and precision the launcher chose for this node (unknown without a launcher)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "world_size": world_size,
    }
    if handoff is not None:
        info.update(gpus=handoff.gpus, nnodes=handoff.nnodes, precision=handoff.precision)
    return info


def run_facts(
    config: Config,
    *,
    world_size: int,
    dataset_fingerprint: str,
    truncation: dict[str, int] | None = None,
    model: dict[str, Any] | None = None,
    masking: dict[str, Any] | None = None,
    packing: dict[str, Any] | None = None,
    started: str,
    status: str,
    handoff: Handoff | None,
) -> dict:
    """What run.json records: enough to tell later exactly what ran, with secrets redacted."""
    return {
        "status": status,
        "started": started,
        "ended": now(),
        "config": config.as_dict(redact=True),
        "versions": package_versions(),
        "world_size": world_size,
        "hardware": hardware(world_size, handoff),
        "seed": config.training.seed,
        "dataset_fingerprint": dataset_fingerprint,
        # Training examples longer than max_seq_length, and the tokens truncation dropped from them.
        "truncation": truncation,
        # The attention implementation that ran and the head the loss went through (masked-only or dense).
        "model": model,
        # The masking rates set, and the share of real tokens the first training samples had masked.
        "masking": masking,
        # The padding mode, whether documents were kept apart, and real tokens per position computed.
        "packing": packing,
        "image_revision": config.job.image_revision,
        # The command the launcher ran (secrets never are in it); absent when the job was started without it.
        "command": handoff.command if handoff is not None else None,
    }


def disk_full(exc: BaseException, directory: Path) -> bool:
    """Whether ``exc`` (or what caused it) is a full device. The writers lose the errno on the way: torch.save
    says "file write failed" or "unexpected pos", safetensors names Rust's StorageFull; so for a failed write
    the device's free space decides."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    if any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in chain):
        return True
    text = " ".join(str(e) for e in chain)
    if any(marker in text for marker in ("No space left on device", "os error 28", "StorageFull")):
        return True
    try:
        writing = any(word in text for word in ("write", "inline_container", "serializ"))
        return writing and shutil.disk_usage(directory).free < LOW_SPACE_BYTES
    except OSError:
        return False


class RunRecord:
    """run.json and the report, written by world rank 0 whenever the run ends (finished, stopped, diverged)."""

    def __init__(
        self,
        config: Config,
        files: RunFiles,
        facts: dict[str, Any],
        handoff: Handoff | None,
        started: str,
        uploaded: Callable[[], None] | None = None,
    ) -> None:
        self.config, self.files, self.facts, self.handoff, self.started = config, files, facts, handoff, started
        self.uploaded = uploaded  # called once the files are written: a store's mirror uploads them

    def write(self, status: str) -> None:
        if not is_world_zero():
            return
        facts = self.facts
        document = run_facts(
            self.config,
            world_size=self.config.training.world_size,
            dataset_fingerprint=facts["dataset_fingerprint"],
            truncation=facts["truncation"],
            model={"attention": facts.get("attention"), "head": facts.get("head")},
            masking=facts.get("masking"),
            packing=facts.get("packing"),
            started=self.started,
            status=status,
            handoff=self.handoff,
        )
        write_json_atomic(self.files.run_json, document)
        write_report_safely(self.files)
        if self.uploaded is not None:
            self.uploaded()


def write_report_safely(files: RunFiles) -> None:
    """The report is a convenience: failing to draw it must not fail a finished or preempted run."""
    try:
        from train.report import write_report  # plotting is imported only when a run ends

        write_report(files.root)
    except ConfigError:
        return  # stopped before its first log step: nothing to draw yet
    except Exception as exc:  # noqa: BLE001 - any drawing failure is only a warning
        warn(f"no report ({type(exc).__name__}: {exc}); try: entrypoint.sh report {files.root}")
