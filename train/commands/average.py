"""``./entrypoint.sh average DIR DIR... --output_dir OUT [--weights W,W,...]``: the average of final models' or
checkpoints' weights (train/model/average.py), written as ``OUT/final``: a model that loads with
``AutoModelForMaskedLM`` and that ``evaluate`` scores, with its card and its files' digests; ``OUT/average.json``
records what was averaged (each input's weights digest) with which weights.

Each input is verified first as ``verify`` does (every file against its marker's list; a checkpoint as a resume
checks it), so a damaged or altered model is refused, not averaged. Models of another architecture, other tensors,
shapes or dtypes are refused. Exit 2 with one line naming the input for any of these; nothing is written.

Local directories only: a model in a bucket is fetched first (``./entrypoint.sh verify URL`` shows how it reads);
a checkpoint of a sharded run (MLM_SHARDING=fsdp) holds its weights as shards: average its final models instead.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from safetensors.torch import load_file, save_file

from train.common.console import now, say
from train.common.distributed import run_and_exit
from train.common.errors import ConfigError
from train.common.usage import wants_help
from train.common.writable import follow_umask
from train.config.model_source import SHARDED_WEIGHTS
from train.model.average import average, mismatch, normalised
from train.outputs.marker import weights_digest, write_marker
from train.outputs.verify import verify
from train.publish.card import write_card

USAGE = "usage: ./entrypoint.sh average DIR DIR... --output_dir OUT [--weights W,W,...]"
RECORD = "average.json"
# What final/ keeps of the first input beside the averaged weights: the model's config and its tokenizer.
KEPT = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
)  # fmt: skip
WEIGHTS_FILE = "model.safetensors"


def parse(args: Sequence[str]) -> tuple[list[Path], Path, list[float] | None]:
    """(the inputs, the output directory, the weights or None); ConfigError naming what is wrong."""
    inputs: list[Path] = []
    output: Path | None = None
    weights: list[float] | None = None
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("--output_dir", "--weights"):
            if not rest:
                raise ConfigError(f"{arg} needs a value; {USAGE}")
            value = rest.pop(0)
            if arg == "--output_dir":
                output = Path(value).expanduser()
            else:
                try:
                    weights = [float(w) for w in value.split(",")]
                except ValueError:
                    raise ConfigError(f"--weights {value!r}: expected numbers separated by commas") from None
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option {arg!r}; {USAGE}")
        else:
            inputs.append(Path(arg).expanduser())
    if len(inputs) < 2 or output is None:
        raise ConfigError(f"give two models or more and --output_dir; {USAGE}")
    if weights is not None:
        try:
            normalised(weights, len(inputs))
        except ValueError as exc:
            raise ConfigError(f"--weights: {exc}") from None
    return inputs, output, weights


def read_model(directory: Path) -> tuple[dict, dict]:
    """A verified input's config and weights (every safetensors file of it); ConfigError naming it otherwise."""
    shown = str(directory)
    verify(directory, shown)  # raises ConfigError naming the wrong file
    if (directory / SHARDED_WEIGHTS).is_dir():
        raise ConfigError(
            f"{shown}: a checkpoint of a sharded run (MLM_SHARDING=fsdp) holds its weights as shards: average the "
            "final models instead"
        )
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{shown}: no safetensors weights to average")
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{shown}/config.json: cannot be read ({exc})") from None
    state: dict = {}
    for path in files:
        state.update(load_file(str(path)))
    return config, state


def same_architecture(inputs: Sequence[Path], configs: Sequence[dict]) -> None:
    first = configs[0]
    for path, config in zip(inputs[1:], configs[1:], strict=True):
        for key in ("model_type", "architectures"):
            if config.get(key) != first.get(key):
                raise ConfigError(
                    f"{path}: {key} {config.get(key)!r}, {first.get(key)!r} in {inputs[0]}: not the same architecture"
                )


def card(inputs: Sequence[Path], weights: Sequence[float], model_type: str) -> str:
    rows = "\n".join(f"| `{path}` | {weight:.4g} |" for path, weight in zip(inputs, weights, strict=True))
    return (
        "---\nlibrary_name: transformers\npipeline_tag: fill-mask\ntags:\n- mlm-trainer\n- averaged\n---\n\n"
        f"# The average of {len(inputs)} {model_type} models\n\n"
        "Each floating-point tensor is the weighted mean of the models' (mlm-trainer's `average` command); the config "
        "and the tokenizer are the first model's.\n\n| model | weight |\n|---|---|\n"
        f"{rows}\n"
    )


def average_models(inputs: Sequence[Path], output: Path, weights: Sequence[float] | None) -> Path:
    """Write ``output/final`` (in a temporary folder renamed at the end: never half written) and the record."""
    final = output / "final"
    if final.exists():
        raise ConfigError(f"--output_dir {output}: holds a final/ already; choose another output_dir")
    read = [read_model(path) for path in inputs]
    configs, states = [config for config, _ in read], [state for _, state in read]
    same_architecture(inputs, configs)
    wrong = mismatch([str(p) for p in inputs], states)
    if wrong:
        raise ConfigError(wrong)
    shares = normalised(weights, len(inputs))
    try:
        averaged = average(states, shares)
    except ValueError as exc:
        raise ConfigError(f"{inputs[0]}: {exc}") from None
    output.mkdir(parents=True, exist_ok=True)
    staging = output / f".final-average-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_file(averaged, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
    follow_umask([staging / WEIGHTS_FILE])  # safetensors writes 0600 (train/common/writable.py)
    for name in KEPT:
        if (inputs[0] / name).is_file():
            shutil.copyfile(inputs[0] / name, staging / name)
    write_marker(staging)
    # after the list, as a run's final/ has it: the card is the one file verify allows beside the list
    write_card(staging, card(inputs, shares, str(configs[0].get("model_type"))))
    os.replace(staging, final)
    record = {
        "averaged": now(),
        "models": [
            {"path": str(path), "weight": share, "weights_sha256": weights_digest(path)}
            for path, share in zip(inputs, shares, strict=True)
        ],
        "final": str(final),
    }
    (output / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return final


def main(argv: Sequence[str] | None = None) -> int:
    """Not train/commands/start.py's start: the arguments are directories and two flags of its own, not the options,
    and ``-h`` answers the one usage line the errors name. It ends as every command does (``run_and_exit``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        print(USAGE)
        return 0
    inputs, output, weights = parse(args)
    final = average_models(inputs, output, weights)
    say(f"averaged {len(inputs)} models into {final}; score it: ./entrypoint.sh evaluate --model_name_or_path {final}")
    return 0


if __name__ == "__main__":
    run_and_exit(main)
