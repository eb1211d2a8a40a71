"""The storage rows: output_dir (train.outputs.local: writable, no finished final/; train.outputs.checkpoints: the
checkpoint a
run would resume from) and the Hugging Face cache (train.common.hf). The free-space thresholds and probing a directory
that does not exist yet through its nearest existing parent are doctor's own; the write probe and the output rules
are the job's."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from train.common import hf
from train.common.errors import ConfigError, UserError
from train.config import Config
from train.doctor.rows import FAIL, OK, WARN, Check
from train.outputs import checkpoints
from train.outputs import local as outputs
from train.outputs.lease import describe_holder
from train.outputs.runfiles import RunFiles

GIB = 1024**3
# Free space below which a run is likely to die writing checkpoints (FAIL) or may (WARN).
FREE_FAIL = 1 * GIB
FREE_WARN = 10 * GIB


def _existing_ancestor(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(name: str, path: Path, fix: str) -> Check:
    """Writable (``outputs.probe_write``, nothing left behind) and enough free space."""
    path = path.expanduser().absolute()
    target = _existing_ancestor(path)
    if not target.is_dir():
        return Check(name, FAIL, f"{path}: {target} is not a directory", fix)
    try:
        outputs.probe_write(target)
    except OSError as exc:
        where = "" if target == path else f" (its nearest existing parent {target})"
        return Check(name, FAIL, f"{path}{where}: not writable ({outputs.write_failure(exc)})", fix)
    free = shutil.disk_usage(target).free
    detail = f"{path}: writable, {free / GIB:,.1f} GiB free"
    if free < FREE_FAIL:
        return Check(name, FAIL, detail, "free space or mount a larger volume: checkpoints will not fit")
    if free < FREE_WARN:
        return Check(name, WARN, detail, "checkpoints of a large model may not fit; mount a larger volume")
    return Check(name, OK, detail)


def check_output(config: Config) -> Check:
    if config.output_store:
        return check_store(config)
    output = RunFiles(config.training.output_dir).root
    label = config.source_of("output_dir")
    check = check_writable(
        "output_dir", output, f"mount a writable volume there (owned by the image's user) or set {label}"
    )
    if check.status == FAIL:
        return check
    try:
        outputs.refuse_finished(config)
        chosen, skipped = checkpoints.resume_choice(config)
    except ConfigError as exc:
        return Check("output_dir", FAIL, f"the job would refuse to start: {exc}")
    if chosen is not None:
        shown = chosen.relative_to(output) if chosen.is_relative_to(output) else chosen
        check.detail += f"; will resume from {shown}"
        check.data["resume_from"] = str(chosen)
    if skipped:
        reasons = ", ".join(f"{path.name} ({reason})" for path, reason in skipped)
        check.detail += f"; would skip and move aside {reasons}"
        check.data["skipped"] = {str(path): reason for path, reason in skipped}
    return check


def check_cache(environ: Mapping[str, str]) -> Check:
    return check_writable(
        "cache (HF_HOME)",
        hf.hf_home(environ),
        "mount a writable volume at the cache (HF_HOME) or point HF_HOME at one",
    )


def check_store(config: Config) -> Check:
    """output_dir in a store: the staging directory writable, the store reachable and writable (the job's
    preflight: a probe object written and removed), who holds its lease, and what a run would do there."""
    from train.outputs.mirror import Mirror  # the store's packages and the Trainer's callback: only a store needs them

    staging = check_writable(
        "output_dir", RunFiles(config.training.output_dir).root, "set MLM_STAGING_DIR to a writable local directory"
    )
    if staging.status == FAIL:
        staging.detail = f"staging directory {staging.detail}"
        return staging
    try:
        mirror = Mirror(config)
        mirror.check()
        facts = mirror.facts()
        holder = mirror.lease().holder()
    except UserError as exc:
        return Check("output_dir", FAIL, f"the job would refuse to start: {exc}")
    held = f"; in use by another run ({describe_holder(holder)})" if holder else ""
    detail = f"{mirror.store.url}: writable; a run would {facts['a run would']}{held}; staging {staging.detail}"
    fix = "wait for it to end, or stop it (a lost holder's lease expires by itself)" if holder else ""
    return Check("output_dir", WARN if holder else staging.status, detail, fix or staging.fix, data=facts)
