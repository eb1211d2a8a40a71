"""One canary per touch of a library's internals (train/borrowed/): each checks that what the touch relies on still
holds - the private name exists, the overridden method still has the parameters we pass and is still called where
we expect, a tiny real use behaves as written - and fails naming the touch and the version it was written against.
No torchrun: a few seconds in all (one tiny Trainer run serves the Trainer's touches).

When one fails after an upgrade: docs/development.md, "Upgrading a library"."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import REPO
from train.borrowed import (
    accelerate,
    datasets,
    fsspec,
    stdlib,
    torch_distributed,
    torch_dynamo,
    torch_optim,
    torchdata,
    torchrun,
    transformers_args,
    transformers_models,
    transformers_trainer,
    triton,
)
from train.borrowed.registry import MODULES, TOUCHES
from train.borrowed.touch import Touch

CANARIES: dict[str, Callable[..., None]] = {}


def canary(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register the decorated test as the canary of the touch ``name`` (``module.qualname``)."""

    def register(check: Callable[..., None]) -> Callable[..., None]:
        CANARIES[name] = check
        return check

    return register


def run_python(code: str) -> str:
    """``code`` in a fresh interpreter (what would disturb this one: atexit, a lazy module's first import)."""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def source(obj: Any) -> str:
    return inspect.getsource(obj)


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


# --- python: argparse, atexit ---------------------------------------------------------------------------------


@canary("stdlib.argparse_actions")
def _argparse_actions(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    first = parser.add_argument("--first")
    grouped = parser.add_argument_group("group").add_argument("--grouped")
    actions = stdlib.argparse_actions(parser)
    assert isinstance(actions, list), "ArgumentParser._actions is no longer a list"
    assert actions[-2:] == [first, grouped], "ArgumentParser._actions no longer lists every action in order"


@canary("stdlib.forget_exit_handlers")
def _forget_exit_handlers(tmp_path: Path) -> None:
    said = run_python(
        "import atexit\nfrom train.borrowed.stdlib import forget_exit_handlers\n"
        "atexit.register(print, 'ran')\nforget_exit_handlers()\n"
    )
    assert "ran" not in said, "atexit._clear left a registered handler in place"


@canary("triton.triton_bindings_loaded")
def _triton_bindings_loaded(tmp_path: Path) -> None:
    said = run_python(
        "from train.borrowed.triton import triton_bindings_loaded\nbefore = triton_bindings_loaded()\n"
        "import torch._dynamo\nprint(before, triton_bindings_loaded())\n"
    )
    assert said.split() == ["False", "True"], f"torch._dynamo no longer loads triton._C.libtriton ({said.strip()})"


@canary("triton.leak_report_part")
def _leak_report_part(tmp_path: Path) -> None:
    script = "import gc, sys, torch._dynamo\nprint('last word', file=sys.stderr, flush=True)\ngc.freeze()\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    first, *report = (done.stderr + b"glued\n").splitlines(keepends=True)  # the next line a stream would carry
    assert first == b"last word\n" and report, "triton's bindings no longer report objects left alive at exit"
    left = b"".join(line[triton.leak_report_part(line) :] for line in report)
    assert left == b"glued\n", f"nanobind's leak report reads otherwise now: {left[:300]!r}"


@canary("stdlib.run_exit_handlers")
def _run_exit_handlers(tmp_path: Path) -> None:
    said = run_python(
        "import atexit, os, sys\nfrom train.borrowed.stdlib import run_exit_handlers\n"
        "atexit.register(print, 'ran')\nrun_exit_handlers()\nsys.stdout.flush()\nos._exit(0)\n"
    )
    assert said.strip() == "ran", "atexit._run_exitfuncs did not run a registered handler"


# --- transformers: the Trainer ----------------------------------------------------------------------------------


class Recording(transformers_trainer.TrainerOverrides):
    """TrainerOverrides whose every hook says it ran, then does the Trainer's own thing."""

    calls: list[str]

    def track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        self.calls.append("track_num_input_tokens")
        super().track_num_input_tokens(inputs)

    def missing_keys_to_report(self, missing: list[str]) -> list[str]:
        self.calls.append("missing_keys_to_report")
        return super().missing_keys_to_report(missing)

    def save_checkpoint_model(self, output_dir: str | None) -> None:
        self.calls.append("save_checkpoint_model")
        super().save_checkpoint_model(output_dir)

    def save_weights(self, output_dir: str | None, state_dict: dict | None) -> None:
        self.calls.append("save_weights")
        super().save_weights(output_dir, state_dict)

    def load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        self.calls.append("load_from_checkpoint")
        super().load_from_checkpoint(resume_from_checkpoint, model)

    def save_optimizer_and_scheduler(self, output_dir: str) -> None:
        self.calls.append("save_optimizer_and_scheduler")
        super().save_optimizer_and_scheduler(output_dir)

    def load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        self.calls.append("load_optimizer_and_scheduler")
        super().load_optimizer_and_scheduler(checkpoint)

    def save_checkpoint(self, model: Any, trial: Any) -> None:
        self.calls.append("save_checkpoint")
        super().save_checkpoint(model, trial)


@dataclasses.dataclass
class TinyRun:
    """What a tiny Trainer did: two steps saved at each, a resume of the second for a third, a final save."""

    first: Recording
    resumed: Recording
    resumed_calls: list[str]
    checkpoint_tokens: int
    final_calls: list[str]
    output: Path


def tiny_trainer(output: Path, max_steps: int) -> Recording:
    from datasets import Dataset
    from transformers import BertConfig, BertForMaskedLM, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16,
    )  # fmt: skip
    rows = [[2, 5, 6, 7, 3], [2, 8, 9, 10, 3]] * 4
    data = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * 5] * 8, "labels": rows})
    args = TrainingArguments(
        output_dir=str(output), max_steps=max_steps, save_strategy="steps", save_steps=1, per_device_train_batch_size=4,
        use_cpu=True, report_to=[], logging_strategy="no", disable_tqdm=True, include_num_input_tokens_seen="all",
        eval_strategy="no",
    )  # fmt: skip
    trainer = Recording(model=BertForMaskedLM(config), args=args, train_dataset=data)
    trainer.calls = []
    return trainer


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    output = tmp_path_factory.mktemp("tiny_trainer")
    first = tiny_trainer(output, max_steps=2)
    first.train()
    checkpoint = output / "checkpoint-2"
    tokens = json.loads((checkpoint / "trainer_state.json").read_text())["num_input_tokens_seen"]
    resumed = tiny_trainer(output, max_steps=3)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    resumed_calls = list(resumed.calls)
    resumed.calls.clear()
    resumed.save_model(str(output / "final"))
    return TinyRun(first, resumed, resumed_calls, tokens, list(resumed.calls), output)


Trainer = transformers_trainer.Trainer


def overridden(name: str, params: list[str], caller: str) -> None:
    """The Trainer still has ``name`` with ``params`` and still calls it as ``caller`` does."""
    assert name in vars(Trainer), f"Trainer.{name} is gone"
    assert parameters(getattr(Trainer, name)) == params, f"Trainer.{name}'s parameters changed"
    assert caller in source(Trainer), f"the Trainer no longer calls {caller}...)"


@canary("transformers_trainer.TrainerOverrides._track_num_input_tokens")
def _track_num_input_tokens(tiny_run: TinyRun) -> None:
    overridden("_track_num_input_tokens", ["self", "inputs"], "self._track_num_input_tokens(inputs")
    assert tiny_run.first.calls.count("track_num_input_tokens") == 2, "not called once per step"
    assert tiny_run.first.state.num_input_tokens_seen == 2 * 4 * 5, "the count is not the batch's tokens"


@canary("transformers_trainer.TrainerOverrides._issue_warnings_after_load")
def _issue_warnings_after_load(tiny_run: TinyRun) -> None:
    overridden("_issue_warnings_after_load", ["self", "load_result"], "self._issue_warnings_after_load(load_result")
    assert "missing_keys_to_report" in tiny_run.resumed_calls, "not called when a checkpoint's weights are loaded"
    result = torch.nn.Linear(1, 1).load_state_dict({}, strict=False)
    assert result._replace(missing_keys=["x"]).missing_keys == ["x"], "load_state_dict's result is no named tuple"


@canary("transformers_trainer.TrainerOverrides.save_model")
def _save_model(tiny_run: TinyRun) -> None:
    overridden(
        "save_model", ["self", "output_dir", "_internal_call"], "self.save_model(output_dir, _internal_call=True"
    )
    assert tiny_run.first.calls.count("save_checkpoint_model") == 2, "a checkpoint's weights did not come through it"
    assert "save_checkpoint_model" not in tiny_run.final_calls, "the final model was taken for a checkpoint's"


@canary("transformers_trainer.TrainerOverrides._save")
def _save(tiny_run: TinyRun) -> None:
    overridden("_save", ["self", "output_dir", "state_dict"], "self._save(output_dir, state_dict=state_dict")
    assert "save_weights" in tiny_run.final_calls, "save_model does not end in _save"
    assert (tiny_run.output / "final" / "model.safetensors").exists(), "_save wrote no weights"


@canary("transformers_trainer.TrainerOverrides._load_from_checkpoint")
def _load_from_checkpoint(tiny_run: TinyRun) -> None:
    overridden("_load_from_checkpoint", ["self", "resume_from_checkpoint", "model"], "self._load_from_checkpoint(")
    assert "load_from_checkpoint" in tiny_run.resumed_calls, "a resume did not load the weights through it"


@canary("transformers_trainer.TrainerOverrides._save_optimizer_and_scheduler")
def _save_optimizer_and_scheduler(tiny_run: TinyRun) -> None:
    overridden("_save_optimizer_and_scheduler", ["self", "output_dir"], "self._save_optimizer_and_scheduler(output_dir")
    assert tiny_run.first.calls.count("save_optimizer_and_scheduler") == 2, "a checkpoint's optimizer skipped it"
    assert (tiny_run.output / "checkpoint-1" / "optimizer.pt").exists(), "the Trainer's own saves no optimizer"


@canary("transformers_trainer.TrainerOverrides._load_optimizer_and_scheduler")
def _load_optimizer_and_scheduler(tiny_run: TinyRun) -> None:
    overridden("_load_optimizer_and_scheduler", ["self", "checkpoint"], "self._load_optimizer_and_scheduler(")
    assert "load_optimizer_and_scheduler" in tiny_run.resumed_calls, "a resume did not load the optimizer through it"


@canary("transformers_trainer.TrainerOverrides._save_checkpoint")
def _save_checkpoint(tiny_run: TinyRun) -> None:
    overridden("_save_checkpoint", ["self", "model", "trial"], "self._save_checkpoint(model, trial")
    assert tiny_run.first.calls.count("save_checkpoint") == 2, "a checkpoint was saved without it"


# What Trainer._save_checkpoint does, in its order: save_checkpoint_in_parts does the same, in parts.
SAVE_CHECKPOINT_STEPS = (
    "self.store_flos()",
    "run_dir = self._get_output_dir(trial=trial)",
    "self.save_model(output_dir, _internal_call=True)",
    "self.state.best_model_checkpoint = best_checkpoint_dir",
    "self._save_optimizer_and_scheduler(output_dir)",
    "self._save_scaler(output_dir)",
    "self._save_rng_state(output_dir)",
    "cb_state = cb.state()",
    "self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))",
    "self._push_from_checkpoint(output_dir)",
    "rotate_checkpoints(",
    "use_mtime=True",
)


@canary("transformers_trainer.save_checkpoint_in_parts")
def _save_checkpoint_in_parts(tmp_path: Path) -> None:
    body = source(Trainer._save_checkpoint)
    at = [body.find(step) for step in SAVE_CHECKPOINT_STEPS]
    missing = [step for step, found in zip(SAVE_CHECKPOINT_STEPS, at, strict=True) if found < 0]
    assert not missing, f"Trainer._save_checkpoint no longer does {missing[0]}"
    assert at == sorted(at), "Trainer._save_checkpoint saves in another order"
    trainer = tiny_trainer(tmp_path, max_steps=1)
    trainer.train()
    trainer.args.save_total_limit = 1
    trainer.state.global_step = 2
    taken: list[str] = []
    rotate = transformers_trainer.save_checkpoint_in_parts(trainer, None, taken.append, "trainer_state.json.pending")
    saved = tmp_path / "checkpoint-2"
    assert taken == [str(saved)], "the state was not taken where the Trainer writes the weights"
    assert (saved / "rng_state.pth").exists(), "no RNG state written"
    assert json.loads((saved / "trainer_state.json.pending").read_text())["global_step"] == 2
    assert not (saved / "trainer_state.json").exists() and not (saved / "model.safetensors").exists()
    assert (tmp_path / "checkpoint-1").exists(), "the rotation ran before the new checkpoint was written"
    rotate()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"], "the rotation kept the old one"


@canary("transformers_trainer.save_checkpoint_now")
def _save_checkpoint_now(tiny_run: TinyRun) -> None:
    assert parameters(Trainer._save_checkpoint) == ["self", "model", "trial"], "Trainer._save_checkpoint changed"
    trainer = tiny_run.resumed
    saved = tiny_run.output / f"checkpoint-{trainer.state.global_step}"
    shutil.rmtree(saved)
    trainer.calls.clear()
    transformers_trainer.save_checkpoint_now(trainer)
    assert (saved / "trainer_state.json").exists(), "no checkpoint of the current step"
    assert "save_checkpoint_model" in trainer.calls, "its weights did not come through save_model"


@canary("transformers_trainer.tokens_at_session_start")
def _tokens_at_session_start(tiny_run: TinyRun) -> None:
    assert "self._initial_num_input_tokens_seen" in source(Trainer), "the Trainer keeps no session start"
    start = transformers_trainer.tokens_at_session_start(tiny_run.resumed)
    assert start == tiny_run.checkpoint_tokens > 0, "a resumed run's start is not its checkpoint's count"


@canary("transformers_trainer.train_batch_size")
def _train_batch_size(tiny_run: TinyRun) -> None:
    assert transformers_trainer.train_batch_size(tiny_run.first) == 4, "not the per-device batch"
    assert "batch_size=self._train_batch_size" in source(Trainer.get_train_dataloader), "the loader uses another"


@canary("transformers_trainer.mark_scheduler_created")
def _mark_scheduler_created(tiny_run: TinyRun) -> None:
    assert "self._created_lr_scheduler = True" in source(Trainer.create_scheduler), "create_scheduler sets no flag"
    assert re.search(r"if self\._created_lr_scheduler:\s+self\.lr_scheduler = None", source(Trainer)), (
        "the Trainer no longer drops a scheduler it created before training again"
    )
    assert tiny_run.first._created_lr_scheduler is True


# --- transformers: arguments, integrations, models ---------------------------------------------------------------


@canary("transformers_args.FieldHookParser._parse_dataclass_field")
def _parse_dataclass_field(tmp_path: Path) -> None:
    from transformers import HfArgumentParser

    assert isinstance(inspect.getattr_static(HfArgumentParser, "_parse_dataclass_field"), staticmethod)
    assert parameters(HfArgumentParser._parse_dataclass_field) == ["parser", "field"], "its parameters changed"

    @dataclasses.dataclass
    class Options:
        size: int = dataclasses.field(default=1, metadata={"help": "a size", "ours": True})

    seen = []

    class Parser(transformers_args.FieldHookParser):
        @staticmethod
        def argparse_field(field: dataclasses.Field[Any]) -> dataclasses.Field[Any]:
            seen.append(field.name)
            return field

    with pytest.raises(TypeError):  # HfArgumentParser still hands add_argument every metadata key
        Parser(Options)
    assert seen == ["size"], "the hook did not see the dataclass's field"


@canary("transformers_integrations.kubeflow_check_answered_by")
def _kubeflow_check_answered_by(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    assert "from .integrations import is_kubeflow_available" in source(TrainingArguments.__post_init__), (
        "TrainingArguments no longer asks integrations.is_kubeflow_available"
    )
    said = run_python(
        "import json, sys\n"
        "from train.borrowed.transformers_integrations import kubeflow_check_answered_by\n"
        "with kubeflow_check_answered_by(lambda: 'ours'):\n"
        "    from transformers.integrations import is_kubeflow_available\n"
        "    inside = is_kubeflow_available()\n"
        "loaded = 'transformers.integrations.integration_utils' in sys.modules\n"
        "from transformers.integrations import is_kubeflow_available\n"
        "print(json.dumps([inside, loaded, is_kubeflow_available.__module__]))\n"
    )
    inside, loaded, after = json.loads(said)
    assert inside == "ours", "the lazy module did not answer with the patch"
    assert not loaded, "asking the lazy module imported integration_utils (and the model code) anyway"
    assert after == "transformers.integrations.integration_utils", "the lazy module was not left as it was"


@canary("transformers_models.attn_implementation")
def _attn_implementation(tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM, BertConfig

    assert transformers_models.attn_implementation(BertConfig()) is None, "a fresh config names an implementation"
    config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="eager")
    assert transformers_models.attn_implementation(model.config) == "eager", "the model's choice is not read back"


@canary("transformers_models.supports_sdpa")
def _supports_sdpa(tmp_path: Path) -> None:
    from transformers import BertForMaskedLM, PreTrainedModel

    assert "_supports_sdpa" in vars(PreTrainedModel), "PreTrainedModel._supports_sdpa is gone"
    assert "self._supports_sdpa" in source(PreTrainedModel.get_correct_attn_implementation), "no longer decides"
    assert transformers_models.supports_sdpa(BertForMaskedLM) is True


@canary("transformers_models.supports_flash_attention")
def _supports_flash_attention(tmp_path: Path) -> None:
    from transformers import ModernBertForMaskedLM, PreTrainedModel

    assert "_supports_flash_attn" in vars(PreTrainedModel), "PreTrainedModel._supports_flash_attn is gone"
    assert "self._supports_flash_attn" in source(PreTrainedModel.get_correct_attn_implementation), "no longer decides"
    assert transformers_models.supports_flash_attention(ModernBertForMaskedLM) is True


# --- torch ------------------------------------------------------------------------------------------------------


@canary("torch_distributed.set_element")
def _set_element(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    root: dict[str, Any] = {"state": {"groups": [{"lr": 0.0}]}}
    torch_distributed.set_element(root, ("state", "groups", 0, "lr"), 0.1)
    assert root == {"state": {"groups": [{"lr": 0.1}]}}, "set_element did not place the value along its path"
    upstream = source(DefaultLoadPlanner.load_bytes)
    assert "set_element(" in upstream and "self.original_state_dict" in upstream, (
        "DefaultLoadPlanner.load_bytes no longer places values with set_element: re-read it for SafeLoadPlanner"
    )
    assert "self.mappings[read_item.dest_index.fqn]" in upstream, "load_bytes finds the path another way"


@canary("torch_distributed.metadata_private_classes")
def _metadata_private_classes(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from train.common.safe_dcp import SafeFileSystemReader, SafeFileSystemWriter

    classes = torch_distributed.metadata_private_classes()
    assert [c.__name__ for c in classes] == ["_StorageInfo", "_MEM_FORMAT_ENCODING"]
    dcp.save({"moment": torch.arange(4.0), "groups": [{"lr": 0.1}]}, storage_writer=SafeFileSystemWriter(tmp_path))
    metadata = SafeFileSystemReader(tmp_path).read_metadata()  # torch.load(weights_only=True), the classes allowed
    assert metadata.state_dict_metadata, "the checkpoint's metadata read back empty"


@canary("torch_optim.lr_functions")
def _lr_functions(tmp_path: Path) -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    functions = torch_optim.lr_functions(scheduler)
    assert functions is not None and len(functions) == 1 and functions[0](3) == 0.25, "LambdaLR.lr_lambdas changed"
    constant = torch.optim.lr_scheduler.ConstantLR(optimizer)
    assert torch_optim.lr_functions(constant) is None, "a scheduler without functions now has lr_lambdas"


@canary("torch_optim.replace_lr_functions")
def _replace_lr_functions(tmp_path: Path) -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    optimizer.step()
    scheduler.step()
    torch_optim.replace_lr_functions(scheduler, [lambda step: 0.25 * step])
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr() == [0.5], "the live scheduler did not follow the functions put in"
    assert scheduler.last_epoch == 2, "the step count was lost"


@canary("torch_optim.scale_peaks")
def _scale_peaks(tmp_path: Path) -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    optimizer.step()
    scheduler.step()
    restored = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    restored.load_state_dict(scheduler.state_dict())
    torch_optim.scale_peaks(restored, 0.5)
    assert restored.get_last_lr() == [0.25] and optimizer.param_groups[0]["lr"] == 0.25, "the peaks did not scale"
    assert restored.last_epoch == 1, "the step count was lost"


@canary("torch_dynamo.compile_counters")
def _compile_counters(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    assert hasattr(counters, "get") and isinstance(counters["frames"], dict), "dynamo's counters changed shape"
    compiled = torch.compile(lambda x: x * 2, backend="eager")
    compiled(torch.ones(2))
    found = torch_dynamo.compile_counters()
    assert found is not None and found.get("frames", {}).get("ok", 0) >= 1, f"no compiled frame counted: {found}"


@canary("torchrun.rank_killed_by_signal")
def _rank_killed_by_signal(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=-9, error_file="<N/A>")
    report = str(ChildFailedError("train.run.job", {1: failure})).encode()
    assert torchrun.rank_killed_by_signal(report) == (1, 9), f"the root cause no longer reads as before:\n{report!r}"
    exited = ProcessFailure(local_rank=1, pid=4242, exitcode=2, error_file="<N/A>")
    assert torchrun.rank_killed_by_signal(str(ChildFailedError("x", {1: exited})).encode()) is None


@canary("torchrun.agent_reports_a_failure")
def _agent_reports_a_failure(tmp_path: Path) -> None:
    import logging

    import torch.distributed.elastic.multiprocessing.api as api
    from torch._logging._internal import TorchLogsFormatter

    said = "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"
    assert said in source(api), "the agent no longer logs a failed rank as it did"
    record = logging.LogRecord(api.__name__, logging.ERROR, api.__file__, 1003, said, (2, 0, 4242, "python"), None)
    line = TorchLogsFormatter().format(record).encode()
    assert torchrun.agent_reports_a_failure(line), f"the agent's log line no longer reads as before: {line!r}"
    assert not torchrun.agent_reports_a_failure(b"a rank's own line\n")


@canary("torchrun.is_agent_signal_exception")
def _is_agent_signal_exception(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    line = f"{SignalException.__module__}.{SignalException.__qualname__}: Process 1 got signal: 15\n".encode()
    assert torchrun.is_agent_signal_exception(line), "SignalException moved or was renamed"


# --- accelerate, datasets ---------------------------------------------------------------------------------------


@canary("accelerate.leave_unwrapped")
def _leave_unwrapped(tmp_path: Path) -> None:
    from accelerate import Accelerator

    assert 'getattr(model, "_is_accelerate_prepared", False)' in source(Accelerator.prepare_model)
    model = torch.nn.Linear(2, 2)
    accelerate.leave_unwrapped(model)
    assert Accelerator(cpu=True).prepare_model(model) is model, "a marked model was prepared again"


@canary("accelerate.give_no_sync")
def _give_no_sync(tmp_path: Path) -> None:
    from accelerate import Accelerator

    assert 'getattr(model, "no_sync", context)' in source(Accelerator.no_sync), "no_sync no longer asks the model"
    flags = []

    class Sharded(torch.nn.Linear):
        def set_requires_gradient_sync(self, value: bool) -> None:
            flags.append(value)

    model = Sharded(2, 2)
    accelerate.give_no_sync(model)
    with model.no_sync():
        assert flags == [False]
    assert flags == [False, True]


@canary("datasets.fingerprint")
def _fingerprint(tmp_path: Path) -> None:
    from datasets import Dataset

    one = Dataset.from_dict({"text": ["a", "b"]})
    assert isinstance(datasets.fingerprint(one), str) and datasets.fingerprint(one), "no fingerprint"
    assert datasets.fingerprint(one.select([1])) != datasets.fingerprint(one), "a selection kept the fingerprint"
    other = Dataset.from_dict({"text": ["a", "c"]})
    assert datasets.fingerprint(other) != datasets.fingerprint(one), "different content, one fingerprint"


@canary("datasets.hub_offline_lifted")
def _hub_offline_lifted(tmp_path: Path) -> None:
    import datasets.config as config
    from datasets.utils import file_utils

    assert "config.HF_HUB_OFFLINE" in source(file_utils._raise_if_offline_mode_is_enabled), (
        "datasets no longer reads config.HF_HUB_OFFLINE at each request"
    )
    was = config.HF_HUB_OFFLINE
    config.HF_HUB_OFFLINE = True
    try:
        with datasets.hub_offline_lifted():
            file_utils._raise_if_offline_mode_is_enabled("s3://bucket/x")  # raises unless lifted
        with pytest.raises(ConnectionError):
            file_utils._raise_if_offline_mode_is_enabled("s3://bucket/x")
    finally:
        config.HF_HUB_OFFLINE = was


# --- torchdata, a datasets stream's state, fsspec ----------------------------------------------------------------


def stream_loader(workers: int, state: dict[str, Any] | None = None) -> Any:
    """torchdata's own StatefulDataLoader over a datasets stream of 24 numbers in two files, in batches of 3, with
    ``workers`` and resumed from ``state``."""
    from datasets import Dataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    stream = Dataset.from_dict({"n": list(range(24))}).to_iterable_dataset(num_shards=2)
    loader = StatefulDataLoader(stream, batch_size=3, num_workers=workers, collate_fn=list)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def as_saved(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as a checkpoint's JSON gives it back."""
    return json.loads(json.dumps(state))


def numbers(batch: list[dict[str, int]]) -> list[int]:
    return [row["n"] for row in batch]


@canary("torchdata.loader_state_problem")
def _loader_state_problem(tmp_path: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    every = inspect.signature(StatefulDataLoader).parameters["snapshot_every_n_steps"].default
    assert every == 1, f"a StatefulDataLoader no longer snapshots every step by default ({every})"
    for workers in (0, 2):
        loader = stream_loader(workers)
        states = [as_saved(loader.state_dict())]  # before a batch, after each, and once the pass has ended
        states += [as_saved(loader.state_dict()) for _ in loader]
        resumed = stream_loader(workers, states[2])
        next(iter(resumed))
        states.append(as_saved(resumed.state_dict()))
        for n, state in enumerate(states):
            problem = torchdata.loader_state_problem(state, workers, 3, dataset_problem=datasets.stream_state_problem)
            assert problem is None, f"{workers} worker(s), state {n}: torchdata writes another layout: {problem}"
        counts = states[2] if not workers else states[2][torchdata.SNAPSHOT]
        counted = counts[torchdata.NUM_YIELDED if not workers else torchdata.SNAPSHOT_STEP]
        assert counted == 2, f"{workers} worker(s): two batches counted as {counted}"
        wrong = as_saved(states[2])
        sampler = wrong if not workers else wrong[torchdata.SNAPSHOT][torchdata.MAIN_SNAPSHOT]
        sampler[torchdata.SAMPLER_ITER_STATE]["samples_yielded"] = 7
        assert torchdata.loader_state_problem(wrong, workers, 3), "a count that disagrees passed"


@canary("torchdata.workers_as_loaded")
def _workers_as_loaded(tmp_path: Path) -> None:
    straight = [numbers(batch) for batch in stream_loader(2)]
    first = stream_loader(2)
    batches = iter(first)
    next(batches), next(batches)
    saved = as_saved(first.state_dict())
    resumed = stream_loader(2, saved)
    batches = iter(resumed)
    assert numbers(next(batches)) == straight[2], "a loaded state does not resume where it was saved"
    given = as_saved(resumed.state_dict())  # worker 1 has not yielded since the load
    again = numbers(next(iter(stream_loader(2, given))))
    assert again != straight[3], "torchdata now saves a worker's loaded position before it yields: drop the mend"
    mended = torchdata.workers_as_loaded(given, saved, 2)
    assert mended is not None, "a worker that has not yielded since the load was left as torchdata gave it"
    assert numbers(next(iter(stream_loader(2, mended)))) == straight[3], "the mended state reads on elsewhere"
    next(batches)
    assert torchdata.workers_as_loaded(as_saved(resumed.state_dict()), saved, 2) is None, "both have yielded"


@canary("datasets.stream_state_problem")
def _stream_state_problem(tmp_path: Path) -> None:
    """The streams the job reads (train/data/stream.py): text files through select_columns, split by file or by
    example, mapped in batches; an in-memory dataset (the demo, save_to_disk) as an iterable one."""
    import datasets as hf_datasets
    from datasets.distributed import split_dataset_by_node

    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} line {i}\n" for i in range(20)))
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    text = hf_datasets.load_dataset("text", data_files=files, split="train", streaming=True).select_columns(["text"])
    memory = hf_datasets.Dataset.from_dict({"text": ["x"] * 20}).to_iterable_dataset(num_shards=4)
    for stream, world_size in ((text, 2), (text, 3), (memory, 2)):
        part = split_dataset_by_node(stream, rank=1, world_size=world_size)
        mapped = part.map(lambda rows: {"length": [len(t) for t in rows]}, batched=True, input_columns=["text"])
        rows = iter(mapped)
        next(rows), next(rows), next(rows)
        state = as_saved(mapped.state_dict())
        assert datasets.stream_state_problem(state, "state") is None, f"datasets writes another state: {state}"
        assert re.search(r'": [1-9]', json.dumps(state)), f"no position counted: {state}"
        negative = json.loads(re.sub(r'": ([0-9]+)', r'": -\1', json.dumps(state)))
        assert datasets.stream_state_problem(negative, "state"), "a negative count passed"
        said = datasets.stream_state_problem({**state, "epoch": "0"}, "state")
        assert said is not None and said.startswith("state.epoch: '0' is not a whole number from 0"), said


@canary("fsspec.s3_ignores_http_client_options")
def _s3_ignores_http_client_options(tmp_path: Path) -> None:
    import fsspec as fs
    import s3fs
    from datasets.filesystems.compression import BaseCompressedFileFileSystem

    handed = source(BaseCompressedFileFileSystem.__init__)
    assert all(f'"{option}"' in handed for option in fsspec.HTTP_CLIENT_OPTIONS), (
        "datasets no longer hands a compressed file's filesystem aiohttp's options: drop the patch"
    )
    options = {"anon": True, "skip_instance_cache": True, "endpoint_url": "http://127.0.0.1:9"}
    client_kwargs = {**dict.fromkeys(fsspec.HTTP_CLIENT_OPTIONS, True), "region_name": "us-east-1"}
    with pytest.raises(TypeError, match="requote_redirect_url|trust_env"):  # creating the client, no request made
        s3fs.S3FileSystem(client_kwargs=client_kwargs, **options).connect()
    served = {protocol: fs.get_filesystem_class(protocol) for protocol in ("s3", "s3a")}
    try:
        fsspec.s3_ignores_http_client_options()
        for protocol in served:
            patched = fs.get_filesystem_class(protocol)(client_kwargs=client_kwargs, **options)
            patched.connect()
            assert patched.client_kwargs == {"region_name": "us-east-1"}, f"{protocol}: {patched.client_kwargs}"
    finally:
        for protocol, served_by in served.items():
            fs.register_implementation(protocol, served_by, clobber=True)


# --- the registry ---------------------------------------------------------------------------------------------


def describe(touch: Touch) -> str:
    return f"{touch.name} (written against {touch.library} {touch.version}: {touch.upstream})"


@pytest.mark.parametrize("touch", TOUCHES, ids=lambda t: t.name)
def test_canary(touch: Touch, request: pytest.FixtureRequest) -> None:
    check = CANARIES.get(touch.name)
    assert check is not None, f"{describe(touch)} has no canary in tests/borrowed/test_canaries.py"
    arguments = {name: request.getfixturevalue(name) for name in parameters(check)}
    try:
        check(**arguments)
    except Exception as exc:  # noqa: BLE001 - whatever broke, the message names the touch
        pytest.fail(f"{describe(touch)} no longer holds: {type(exc).__name__}: {exc}", pytrace=True)


def test_every_canary_is_a_touch() -> None:
    assert sorted(set(CANARIES) - {t.name for t in TOUCHES}) == []


def test_each_touch_says_its_version_and_upstream() -> None:
    vague = [t.name for t in TOUCHES if t.version not in t.why or Path(t.upstream.split()[0]).name not in t.why]
    assert vague == [], "these docstrings do not name their version and upstream file"


def test_the_registry_imports_every_module_of_the_package() -> None:
    package = REPO / "train" / "borrowed"
    names = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__", "registry", "touch"}
    assert {m.__name__.rsplit(".", 1)[-1] for m in MODULES} == names
