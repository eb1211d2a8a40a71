"""Everything the job leaves in output_dir: an atomic ``final/``, ``all_results.json``, ``run.json``, and the
checks that keep earlier work safe (a finished ``final/`` is never replaced unless asked; checkpoints are
resumed only when complete)."""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from train.config import Config
from train.errors import ConfigError, EnvironmentProblem

FINAL = "final"
COMPLETE_MARKER = ".complete"  # written into a checkpoint once the Trainer has finished saving it
CHECKPOINT_PREFIX = "checkpoint-"
WRITE_PROBE_BYTES = 1 << 20


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def check_output_dir(config: Config) -> Path:
    """Fail early, before any work: output_dir must be writable and must not hold a finished run to overwrite."""
    output = Path(config.training.output_dir)
    label = config.source_of("output_dir")
    try:
        output.mkdir(parents=True, exist_ok=True)
        # Write real bytes: on a full device creating an empty file still succeeds.
        with tempfile.NamedTemporaryFile(dir=output, prefix=".write-test-") as probe:
            probe.write(b"\0" * WRITE_PROBE_BYTES)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        reason = "no space left on the device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        message = f"{label}={str(output)!r}: not writable ({reason}); expected a writable directory"
        raise EnvironmentProblem(message) from None
    if (output / FINAL).exists() and not config.job.overwrite_output_dir:
        raise ConfigError(
            f"{label}={str(output)!r}: holds a finished model in {FINAL}/; set MLM_OVERWRITE_OUTPUT_DIR=true to "
            "replace it, or choose another output_dir"
        )
    return output


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def publish_final(output_dir: Path, write: Callable[[Path], None]) -> Path:
    """Write the final model into a temporary directory, then rename it into place.

    A crash at any point leaves either no ``final/`` or the previous one whole, never a partial one.
    """
    final = output_dir / FINAL
    staging = output_dir / f".{FINAL}.tmp"
    shutil.rmtree(staging, ignore_errors=True)  # left over by a crashed run
    staging.mkdir(parents=True)
    write(staging)
    if final.exists():
        retired = output_dir / f".{FINAL}.old-{os.getpid()}"
        os.replace(final, retired)
        os.replace(staging, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, final)
    return final


def mark_complete(checkpoint: Path) -> None:
    (checkpoint / COMPLETE_MARKER).write_text(now() + "\n", encoding="utf-8")


def checkpoints(output_dir: Path) -> list[Path]:
    """Checkpoint directories, oldest first."""
    found = [
        p for p in output_dir.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir() and p.name[len(CHECKPOINT_PREFIX) :].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def find_resume_checkpoint(config: Config, warn: Callable[[str], None]) -> str | None:
    """The checkpoint to resume from: MLM_RESUME=auto (newest complete one), never, or an explicit path."""
    resume = config.job.resume
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume)
        if not (path / "trainer_state.json").exists():
            raise ConfigError(f"{config.source_of('resume')}={resume!r}: not a checkpoint directory")
        return str(path)
    for candidate in reversed(checkpoints(Path(config.training.output_dir))):
        if (candidate / COMPLETE_MARKER).exists():
            return str(candidate)
        # Moved aside, not deleted: the Trainer would otherwise write into it again, or keep it while rotating
        # away the complete checkpoint this run resumes from.
        aside = candidate.with_name(f".incomplete-{candidate.name}-{os.getpid()}")
        os.replace(candidate, aside)
        warn(f"skipping incomplete checkpoint {candidate} (cut off while being written); moved to {aside.name}")
    return None


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("torch", "transformers", "datasets", "accelerate", "tokenizers", "nvidia-ml-py"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def hardware(world_size: int) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "world_size": world_size,
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def run_facts(config: Config, *, world_size: int, dataset_fingerprint: str, started: str, status: str) -> dict:
    """What run.json records: enough to tell later exactly what ran, with secrets redacted."""
    return {
        "status": status,
        "started": started,
        "ended": now(),
        "config": config.as_dict(redact=True),
        "versions": package_versions(),
        "world_size": world_size,
        "hardware": hardware(world_size),
        "seed": config.training.seed,
        "dataset_fingerprint": dataset_fingerprint,
        "image_revision": config.job.image_revision,
        "argv": [sys.executable, "-m", "train.job"],
    }
