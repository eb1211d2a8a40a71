"""The storage rows: output_dir as the output location the job holds (train/outputs/location.py: writable, no
finished final/, the checkpoint a run would resume from, the lease) and the Hugging Face cache (train.common.hf).
The free-space thresholds and probing a directory that does not exist yet through its nearest existing parent are
doctor's own; the write probe and the output rules are the job's."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from train.common import hf
from train.common.errors import UserError
from train.common.writable import probe_write, write_failure
from train.doctor.rows import FAIL, OK, WARN, Check
from train.outputs.base import OutputLocation
from train.outputs.lease import describe_holder

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
    """Writable (``probe_write``, nothing left behind) and enough free space."""
    path = path.expanduser().absolute()
    target = _existing_ancestor(path)
    if not target.is_dir():
        return Check(name, FAIL, f"{path}: {target} is not a directory", fix)
    try:
        probe_write(target)
    except OSError as exc:
        where = "" if target == path else f" (its nearest existing parent {target})"
        return Check(name, FAIL, f"{path}{where}: not writable ({write_failure(exc)})", fix)
    free = shutil.disk_usage(target).free
    detail = f"{path}: writable, {free / GIB:,.1f} GiB free"
    data = {"free_bytes": free}
    if free < FREE_FAIL:
        return Check(name, FAIL, detail, "free space or mount a larger volume: checkpoints will not fit", data=data)
    if free < FREE_WARN:
        return Check(name, WARN, detail, "checkpoints of a large model may not fit; mount a larger volume", data=data)
    return Check(name, OK, detail, data=data)


def check_output(location: OutputLocation) -> Check:
    """The output location as a run would find it: its local directory (output_dir, or a bucket's staging
    directory) writable with room, no symbolic link inside it, the store reachable (a probe object written and
    removed), no finished model to overwrite unless asked, who holds its lease, and what a run would do there."""
    fix = f"mount a writable volume there (owned by the image's user) or set {location.root_label}"
    local = check_writable("output_dir", location.files.root, fix)
    if local.status == FAIL:
        return local
    try:
        location.refuse_links()
        location.preflight()
        location.refuse_finished()
        facts = location.facts()
        holder = location.lease().holder()
    except UserError as exc:
        return Check("output_dir", FAIL, f"the job would refuse to start: {exc}")
    held = f"; in use by another run ({describe_holder(holder)})" if holder else ""
    skipped = facts.get("skipped_checkpoints") or {}
    aside = "; would skip and move aside " + ", ".join(f"{n} ({why})" for n, why in skipped.items()) if skipped else ""
    free = f"{local.data['free_bytes'] / GIB:,.1f} GiB free in {location.files.root}"
    detail = f"{location.shown}: writable; a run would {facts['a run would']}{aside}{held}; {free}"
    fix = "wait for it to end, or stop it (a lost holder's lease expires by itself)" if holder else local.fix
    return Check("output_dir", WARN if holder else local.status, detail, fix, data=facts)


def check_cache(environ: Mapping[str, str]) -> Check:
    return check_writable(
        "cache (HF_HOME)",
        hf.hf_home(environ),
        "mount a writable volume at the cache (HF_HOME) or point HF_HOME at one",
    )
