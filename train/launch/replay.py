"""``./entrypoint.sh replay RUN_JSON [--output_dir DIR] [--anyway] [--option value ...]``: run a finished run's
recipe again and say whether it made the same model.

run.json records the options the user set (``options``: a preset's included, the launcher's decisions and the
output location not), the versions, the world size, the data's fingerprint and the SHA-256 of final/'s files
(train/outputs/record.py). A replay passes those options as flags, so an ``MLM_*`` variable left in the
environment cannot change them. What a run.json (data, perhaps written by someone else into a shared volume) may
not decide for the person typing ``replay``: whether a model's own code runs (``trust_remote_code``: a recorded
``true`` is refused unless the replay's command line or environment gives it), what reaches the network (a push to
the hub, a tracker: not taken from the record; give them again to use them) and where anything is written (the
replay's output directory is its own). Before anything runs it compares what can still differ - an option the
environment sets that the run did not, the library versions, the image revision, the world size the launcher
plans, the data's fingerprint - and refuses with one line per difference (exit 2) unless ``--anyway``. An option
named on the replay's own command line is an override: the run goes on, said to be no longer a replay. At the end
the new final/ is compared file by file with the recorded digests: "identical", or which files differ and, for
the weights when the original final/ sits beside run.json, the largest absolute difference.

What no library offers: torchrun and the Trainer rerun a script, not a record of one (the anchors we compare with
keep none either).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec

from train.common.errors import ConfigError
from train.common.urls import is_store_url
from train.common.versions import package_versions
from train.config import Config, ModelArguments
from train.outputs.marker import listed_files
from train.outputs.record import NOT_COMPARED, RecordedRun, read_recorded

ANYWAY = "--anyway"
# Options about how a run is watched, stored, published and launched, not what it computes: the environment may
# set them differently for a replay (the image revision is compared on its own).
NOT_THE_RECIPE = (
    "output_dir", "logging_dir", "staging_dir", "overwrite_output_dir", "resume", "config", "image_revision",
    "run_name", "log_format", "report_to", "disable_tqdm", "logging_steps", "logging_strategy", "logging_first_step",
    "save_strategy", "save_steps", "save_total_limit", "push_to_hub", "hub_model_id", "hub_private_repo",
    "hub_token", "max_restarts", "stop_timeout", "rdzv_timeout", "store_retry_timeout", "dataloader_num_workers",
    "require_gpu",
    # finetune's task (./entrypoint.sh finetune): a training run never reads them
    "task", "task_text_column", "task_text_pair_column", "task_label_column", "task_learning_rate", "task_epochs",
    "task_seeds", "task_baselines",
)  # fmt: skip
# Never taken from a run.json: the person replaying gives them on the command line or in the environment.
RUNS_CODE = ("trust_remote_code",)  # a model's own Python code, from the hub or its directory
REACHES_NETWORK = ("push_to_hub", "hub_model_id", "hub_private_repo", "hub_strategy", "report_to")  # docs/replay.md
WHERE_IT_WRITES = ("output_dir", "logging_dir", "staging_dir", "overwrite_output_dir", "resume", "config")
NOT_FROM_THE_RECORD = (*RUNS_CODE, *REACHES_NETWORK, *WHERE_IT_WRITES)


def read_run(location: str) -> RecordedRun:
    """run.json from a path or a URL (any fsspec store), checked field by field; ConfigError naming it when it is
    no finished run's or a field has the wrong shape."""
    try:
        with fsspec.open(location, "r", encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"replay {location}: cannot read a run.json there ({exc})") from None
    return read_recorded(document, f"replay {location}")


def flag_values(name: str, value: Any) -> list[str]:
    """One option as the command line gives it: ``--name value`` (a list: its items; a mapping: JSON)."""
    if isinstance(value, bool):
        return [f"--{name}", "true" if value else "false"]
    if isinstance(value, list):
        return [f"--{name}", *(str(item) for item in value)] if value else []
    if isinstance(value, dict):
        return [f"--{name}", json.dumps(value)]
    return [] if value is None else [f"--{name}", str(value)]


def named_options(args: Sequence[str]) -> list[str]:
    """The options ``--name value`` / ``--name=value`` arguments name."""
    return [arg[2:].split("=", 1)[0] for arg in args if arg.startswith("--")]


def replay_argv(run: RecordedRun, location: str, overrides: Sequence[str]) -> list[str]:
    """The recorded options as flags, less those the command line names (they follow and win) and those a record
    may not decide (``NOT_FROM_THE_RECORD``), and the replay's own output directory unless named."""
    named = set(named_options(overrides)) | set(NOT_FROM_THE_RECORD)
    argv = [flag for name, value in run.options.items() if name not in named for flag in flag_values(name, value)]
    if "output_dir" not in named_options(overrides):
        argv += ["--output_dir", default_output_dir(location)]
    return [*argv, *overrides]


def withheld(run: RecordedRun, model: ModelArguments, sources: Mapping[str, str], location: str) -> list[str]:
    """The recorded options a replay did not take (network ones not set for it, in ``sources``: in words for the
    log); ConfigError when the record ran a model's own code and this replay (``model``) was not told to."""
    for name in RUNS_CODE:
        if run.options.get(name) and not getattr(model, name):
            raise ConfigError(
                f"replay {location}: the recorded run set {name}=true (the model's own code runs); a run.json does "
                f"not grant that: add --{name} true to the replay (or MLM_{name.upper()}=true) to allow it"
            )
    return [f"{name}={run.options[name]!r}" for name in REACHES_NETWORK if name in run.options and name not in sources]


def split_args(args: Sequence[str]) -> tuple[str, list[str], bool]:
    """``RUN_JSON [--anyway] [--option value ...]``: the run.json, the overrides, whether to go on anyway."""
    if not args or args[0].startswith("-"):
        raise ConfigError("usage: ./entrypoint.sh replay RUN_JSON [--output_dir DIR] [--anyway] [--option value ...]")
    rest = list(args[1:])
    anyway = ANYWAY in rest
    return args[0], [arg for arg in rest if arg != ANYWAY], anyway


def default_output_dir(location: str) -> str:
    """Beside the recorded run: ``<its output_dir>-replay`` for a local run.json, ``./output/replay`` otherwise."""
    path = Path(location)
    return "./output/replay" if is_store_url(location) else f"{path.parent}-replay"


def overridden(sources: Mapping[str, str], overrides: Sequence[str]) -> list[str]:
    """The options the replay's command line names (output_dir aside) and set (in ``sources``): they make it no
    longer a replay."""
    return [name for name in named_options(overrides) if name != "output_dir" and name in sources]


def differences(
    run: RecordedRun,
    config: Config,
    overrides: Sequence[str],
    world_size: int,
    fingerprint: str,
    data_changes: Sequence[str] = (),
) -> list[str]:
    """What would make this run differ from the recorded one, one line each (the overrides named on the command
    line are not among them: they are asked for). It takes the whole Config because it compares the whole: every
    resolved option and where it was set, against the record's."""
    found = []
    recorded, resolved = run.config, config.as_dict(redact=True)
    asked = set(overridden(config.sources, overrides))
    for name in sorted(config.sources):
        if name in run.options or name in asked or name in NOT_THE_RECIPE or name not in recorded:
            continue
        if resolved.get(name) != recorded.get(name):
            found.append(
                f"{config.source_of(name)}: {name} {resolved.get(name)!r} (recorded: {recorded.get(name)!r}); "
                "unset it, or name it on the command line to change the recipe"
            )
    versions = package_versions()
    for package, version in sorted(run.versions.items()):
        if versions.get(package) != version:
            found.append(f"{package} {versions.get(package)} (recorded: {version})")
    if (run.image_revision or None) != (config.launch.image_revision or None):
        found.append(f"image revision {config.launch.image_revision} (recorded: {run.image_revision})")
    if run.world_size != world_size:
        found.append(
            f"world size {world_size} (recorded: {run.world_size}): the same processes and nodes, or MLM_NPROC_PER_NODE"
        )
    if run.dataset_fingerprint != fingerprint or data_changes:
        detail = f": {'; '.join(data_changes)}" if data_changes else ""
        found.append(f"data fingerprint {fingerprint} (recorded: {run.dataset_fingerprint}): the data changed{detail}")
    return found


# On GPUs the same recipe differs in the last bits from run to run: cuBLAS picks split-K reductions by workspace,
# and atomics-based kernels (scatter, index_add, some attention backwards) add in whatever order threads finish.
# TrainingArguments' full_determinism (transformers.enable_full_determinism) fixes both: CUBLAS_WORKSPACE_CONFIG
# :4096:8, torch.use_deterministic_algorithms, cuDNN's deterministic mode; it costs speed, so it is asked for.
GPU_DETERMINISM = (
    "on GPUs identical weights need MLM_FULL_DETERMINISM=true in the recorded run and its replay (deterministic "
    "algorithms, a fixed cuBLAS workspace; slower)"
)


def compare_final(run: RecordedRun, location: str, final: Path) -> str:
    """The replay's final/ against the recorded digests: ``identical``, or which files differ (and how far the
    weights are, where the original final/ sits beside run.json)."""
    listed = listed_files(final) or {}
    now = {name: entry.get("sha256") for name, entry in listed.items() if name not in NOT_COMPARED}
    recorded = run.final
    changed = sorted(name for name in recorded.keys() | now.keys() if recorded.get(name) != now.get(name))
    if not changed:
        return f"identical: every file of final/ has the recorded SHA-256 ({len(now)} files)"
    said = f"differs from the recorded run: {', '.join(changed)}"
    if run.gpus and not run.config.get("full_determinism"):
        said += f"; {GPU_DETERMINISM}"
    original = Path(location).parent / "final" / "model.safetensors"
    if "model.safetensors" in changed and not is_store_url(location) and original.is_file():
        said += f"; the weights' largest absolute difference is {largest_difference(original, final):.3g}"
    return said


def largest_difference(original: Path, final: Path) -> float:
    from safetensors.torch import load_file  # costly: only when weights differ

    before, after = load_file(str(original)), load_file(str(final / "model.safetensors"))
    shared = before.keys() & after.keys()
    return max(
        (
            float((before[k].float() - after[k].float()).abs().max())
            for k in shared
            if before[k].shape == after[k].shape
        ),
        default=float("nan"),
    )
