"""Whether a directory takes writes, and telling a full device from other write failures: the output directory,
its staging directory and the Hugging Face cache are checked the same way by the launcher, the job and doctor. And a
written file's mode as an ordinary write gives it, for writers that make theirs private."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from train.common.errors import EnvironmentProblem
from train.common.hf import cache_root, hf_home

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


def current_umask() -> int:
    """This process's umask, read from /proc (Linux 4.7+): os.umask reads it only by setting it, and in that moment
    a file another thread creates (a TensorBoard event file) would get the wrong mode."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(paths: Iterable[Path]) -> None:
    """Give files the mode an ordinary write gives (0666 less the umask), as every other file of output_dir has:
    safetensors 0.8 writes model.safetensors 0600 (through a private temporary file), which another user ID
    reading the output volume, a serving container's, cannot load."""
    mode = 0o666 & ~current_umask()
    for path in paths:
        path.chmod(mode)
