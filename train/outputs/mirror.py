"""A run whose output_dir is in a store (``MLM_OUTPUT_DIR=s3://bucket/prefix``): the job trains into a local staging
directory (train/config/implied.py's ``stage_outputs``; train/outputs/location.py chooses this class) and this module
mirrors it to the store (train/outputs/store.py) at the moments that keep the store resumable on its own, by any
node, from nothing:

- before training, world rank 0 (:meth:`Mirror.choose_resume`): a finished model in the store refused or started over; a
  checkpoint whose upload was cut off (in the store incomplete, in staging whole) uploaded again; the checkpoint
  to resume from chosen in the store, downloaded and checked, damaged ones moved aside in the store; staging
  cleared of what belongs to earlier runs (the store's files are the truth: the Trainer's rotation counts the
  checkpoints it finds, the report reads logs/train.jsonl, which is fetched from the store to be appended to);
- then every other node downloads that checkpoint into its own staging directory (:meth:`Mirror.localize`): nodes
  share no volume;
- at every save (:meth:`Mirror.checkpoint_saved`), the stop on SIGTERM's included: each rank uploads the files only
  it wrote (its RNG state), world rank 0 every other file, then, all ranks done, the completeness marker, and
  save_total_limit is applied in the store;
- at the end (:meth:`Mirror.publish`, :meth:`Mirror.sync`): final/ (whole or absent), run.json,
  all_results.json, logs/ and the report.

What the libraries lack: the Trainer writes only directories, and fsspec has no rename, so "whole" is a marker
written last (train/outputs/store.py); torch.distributed.checkpoint's fsspec writer saves a model's state, not the
Trainer's checkpoint (optimizer, scheduler, RNG and data position) that resume needs.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from train.common import distributed
from train.common.console import say
from train.common.errors import ConfigError
from train.common.urls import is_store_url
from train.outputs.base import OutputLocation, OutputOptions, Warn
from train.outputs.checkpoints import problem, resume_choice, set_aside, surplus_asides
from train.outputs.local import publish_final
from train.outputs.marker import writer_of
from train.outputs.retention import Retention
from train.outputs.runfiles import ASIDE_PREFIX, TRAINER_STATE, is_checkpoint_name, step_of
from train.outputs.store import NAMES, VANISHED, BadKey, Retry, Store
from train.outputs.store_lease import StoreLease


class Mirror(OutputLocation):
    """output_dir is in a store: the run writes a staging directory, mirrored to the store."""

    def __init__(self, options: OutputOptions, store: Store | None = None) -> None:
        if options.store is None:
            raise ValueError("output_dir is not in a store")
        super().__init__(options)
        retry = Retry(total_s=options.outputs.store_retry_timeout)
        self.store = store or Store(options.store, label=options.store_source, retry=retry)

    @property
    def shown(self) -> str:
        return self.store.url

    @property
    def where(self) -> str:
        return f"{self.store.label}={self.store.url!r}"

    @property
    def final_shown(self) -> str:
        return f"{self.store.url}/{NAMES.final}"

    def summary(self) -> str:
        return f"{self.store.url} (staged in {self.files.root})"

    def newest_step(self) -> int:
        return max(self.store.complete_checkpoints(), default=0)

    def lease(self) -> StoreLease:
        return StoreLease(self.store)

    # -- before a run: the launcher, plan, doctor and world rank 0 --
    def preflight(self) -> None:
        """The bucket exists (ConfigError, exit 2) and takes writes (EnvironmentProblem, exit 3, for credentials or
        an unreachable store)."""
        self.store.preflight()

    def has_final(self) -> bool:
        return self.store.has_final()

    def retire_final(self) -> None:
        self.store.remove(NAMES.final_previous)
        self.store.move(NAMES.final, NAMES.final_previous)

    def remove_checkpoints(self) -> int:
        old = self.store.checkpoint_steps()
        for step in old:
            self.store.remove(NAMES.checkpoint(step))
        return len(old)

    def survey(self) -> tuple[str, dict[str, Any]]:
        steps = self.store.checkpoint_steps()  # one listing of the store
        complete = sorted((step for step, done in steps.items() if done), reverse=True)
        resume = self.options.checkpoint.resume
        if resume == "never" or not (complete or resume != "auto"):
            would = "start from step 0"
        else:
            would = f"resume from {resume if resume != 'auto' else NAMES.checkpoint(complete[0])} (if it loads)"
        return would, {
            "store": self.store.url,
            "staging_dir": str(self.files.root),
            "complete_checkpoints": [NAMES.checkpoint(step).name for step in complete],
            "incomplete_checkpoints": [NAMES.checkpoint(s).name for s, done in sorted(steps.items()) if not done],
        }

    # -- the start of a run --
    def choose_resume(self, warn: Warn) -> str | None:
        """World rank 0, holding the lease, before training: returns the local checkpoint to resume from."""
        resume, store = self.options.checkpoint.resume, self.store
        self.start_over(warn)
        self.recover(warn)
        self.clear_staging()
        if resume == "never":
            return None
        if resume != "auto":
            return self.explicit_resume()
        chosen, skipped = store.newest_resumable(self.files.root)
        vanished = {str(NAMES.checkpoint(step)) for step, reason in skipped if reason == VANISHED}

        def move(name: str) -> str | None:
            if name in vanished:
                return None
            aside = NAMES.aside(Path(name), os.getpid())
            store.move(name, aside)
            return str(aside)

        named = [(str(NAMES.checkpoint(step)), reason) for step, reason in skipped]
        set_aside(named, chosen.name if chosen else None, move, lambda line: warn(f"{self.where}: {line}"))
        self.tidy_asides()
        return str(chosen) if chosen else None

    def recover(self, warn: Callable[[str], None]) -> None:
        """A checkpoint whose upload was cut off (the store failed, or the stop timeout ended it) is in staging
        whole and in the store incomplete: it is uploaded now, so nothing the last run saved is lost. Only such
        a one: a staging directory outliving its store (a bucket emptied on purpose) revives nothing."""
        if self.options.checkpoint.resume != "auto":
            return
        steps = self.store.checkpoint_steps()
        newest = max((step for step, done in steps.items() if done), default=-1)
        for local in reversed(self.files.checkpoints()):
            if step_of(local) > newest and steps.get(step_of(local)) is False and problem(local) is None:
                warn(f"{self.where}: uploading {local.name}, which the last run saved but did not finish uploading")
                self.store.upload_checkpoint(local)
                return

    def clear_staging(self) -> None:
        """Staging is a copy: what an earlier run left there goes (the store's copies are the truth), and the
        run's log, which a resumed run appends to, comes from the store."""
        files = self.files
        for path in [*files.checkpoints(), *files.asides(), files.final, files.final_staging, files.final_previous]:
            shutil.rmtree(path, ignore_errors=True)
        for path in (files.run_json, files.all_results, files.train_jsonl, files.report):
            path.unlink(missing_ok=True)
        name = files.train_jsonl.relative_to(files.root)
        if self.store.exists(name):
            files.logs.mkdir(parents=True, exist_ok=True)
            self.store.retrying(f"reading {name}", self.store.fs.get_file, self.store.key(name), str(files.train_jsonl))

    def explicit_resume(self) -> str:
        """MLM_RESUME=<checkpoint's URL>: downloaded into staging; a local path: as for a directory."""
        checkpoint = self.options.checkpoint
        resume, label = checkpoint.resume, checkpoint.source_of("resume")
        if not is_store_url(resume):
            chosen, _ = resume_choice(checkpoint, self.files)
            return str(chosen)
        parent, _, name = resume.rstrip("/").rpartition("/")
        if not is_checkpoint_name(name):
            raise ConfigError(f"{label}={resume!r}: not a checkpoint (expected a URL ending in checkpoint-<step>)")
        source = Store(parent, label=label, retry=self.store.retry)
        try:
            local = source.download_checkpoint(step_of(Path(name)), self.files.root)
        except FileNotFoundError:
            raise ConfigError(f"{label}={resume!r}: no such checkpoint") from None
        except BadKey as exc:
            raise ConfigError(f"{label}={resume!r}: {exc}") from None
        reason = problem(local)
        if reason:
            shutil.rmtree(local, ignore_errors=True)
            raise ConfigError(f"{label}={resume!r}: {reason}")
        return str(local)

    def tidy_asides(self) -> None:
        """The newest checkpoints moved aside stay in the store (train/outputs/checkpoints.py, surplus_asides)."""
        asides = {rel.parts[0] for rel in self.store.listing() if rel.parts[0].startswith(ASIDE_PREFIX)}
        for name in surplus_asides(sorted(asides)):
            self.store.remove(name)

    def localize(self, resume: str | None) -> str | None:
        """Every rank but world rank 0, after it chose: the chosen checkpoint in this node's staging directory
        (its local rank 0 downloads; a staging directory shared with world rank 0's gets an identical copy
        renamed over its own before anyone reads it). Returns this node's path of it."""
        if resume is None:
            return None
        step = step_of(Path(resume))
        if self.options.training.local_process_index == 0 and not distributed.is_world_zero():
            self.store.download_checkpoint(step, self.files.root)
        return str(self.files.checkpoint(step))

    # -- a checkpoint saved --
    def checkpoint_saved(self, step: int, retention: Retention, protect: list[int]) -> None:
        """Every rank (the Trainer saves on all of them): each uploads the files only it wrote, world rank 0 every
        other file; two barriers keep the marker after every rank's files; then the retention rule in the store."""
        store, local = self.store, self.files.checkpoint(step)
        rank, started = distributed.world_rank(), time.monotonic()
        if rank == 0:
            store.remove(NAMES.checkpoint(step))  # a copy of this step cut off, or saved before
        distributed.barrier()
        if local.is_dir():
            store.put_checkpoint_files(local, lambda rel: writer_of(rel) == rank)
        distributed.barrier()
        if rank == 0:
            store.mark(local)
            store.rotate(retention, protect)
            size = sum(path.stat().st_size for path in local.rglob("*") if path.is_file()) / 2**20
            say(f"uploaded {local.name} to {store.url} ({size:,.1f} MiB in {time.monotonic() - started:.1f} s)")
        elif local.is_dir() and not (local / TRAINER_STATE).exists():
            shutil.rmtree(local, ignore_errors=True)  # this node's RNG states, uploaded: staging keeps no more

    # -- the end of a run --
    def publish(self, write: Callable[[Path], None]) -> None:
        """final/ written whole in staging, then into the store (train/outputs/store.py: the weights last, then
        the marker); final.previous/ goes."""
        publish_final(self.files, write)
        self.store.publish_final(self.files.final)
        self.store.remove(NAMES.final_previous)

    def sync(self, *paths: Path) -> None:
        """Files of staging into the store, each file one object replaced whole."""
        self.store.upload(self.files.root, *(path.relative_to(self.files.root) for path in paths))

    def keep_crash_log(self, log: Path) -> None:
        """A rank's crash log into the store, at once and without long retries (the run is ending: its one line
        says where the traceback is, in staging; this copies it where it outlives the machine). Never raises."""
        try:
            store = Store(self.options.store or "", label=self.store.label, retry=Retry(attempts=2, total_s=5))
            if log.is_file():
                store.put(log, log.relative_to(self.files.root))
        except Exception:  # noqa: BLE001 - a crash is being reported: the upload is a courtesy
            return
