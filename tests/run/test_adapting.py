"""Adapting a pretrained encoder (train/model/adapting.py, train/run/adapting.py): layers frozen for every
architecture, the head's own rate, the warm-up's frozen encoder (a resumed step included), the drift measured and
warned of; and, under a real two-rank torchrun, a warm-up that leaves the encoder exactly as handed over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast

from tests.conftest import run_torchrun, tiny_env
from tests.helpers import trainer_settings
from tools.models import ARCHITECTURES, tiny_config
from train.common.errors import ConfigError
from train.config import load_config
from train.model.adapting import freeze_first_layers, head_parameters, held_out_batch
from train.run.adapting import DRIFT_WARNING, EncoderDrift, check_adapting, with_head_rate
from train.run.sharding import check_sharding
from train.run.trainer import MLMTrainer
from train.run.trainer_settings import HeadTraining


def tiny_bert() -> BertForMaskedLM:
    torch.manual_seed(0)
    sizes = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32}
    return BertForMaskedLM(BertConfig(vocab_size=64, **sizes))


def frozen_names(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if not p.requires_grad}


@pytest.mark.parametrize("kind", ARCHITECTURES)
def test_the_embeddings_and_first_layers_freeze_in_every_architecture(kind: str) -> None:
    model = AutoModelForMaskedLM.from_config(tiny_config(kind))
    embedding = model.get_input_embeddings().weight
    if kind == "albert":  # one set of weights shared by every layer: no first layers apart
        with pytest.raises(ConfigError, match=r"^MLM_FREEZE_LAYERS=1: AlbertForMaskedLM has no separate layers"):
            freeze_first_layers(model, 1, "MLM_FREEZE_LAYERS")
        freeze_first_layers(model, 0, "MLM_FREEZE_LAYERS")
        assert not embedding.requires_grad
        return
    with pytest.raises(ConfigError, match=r"^MLM_FREEZE_LAYERS=9: \w+ has 2 layers; expected at most 2$"):
        freeze_first_layers(model, 9, "MLM_FREEZE_LAYERS")
    assert not frozen_names(model)
    one = set(freeze_first_layers(model, 1, "MLM_FREEZE_LAYERS"))
    assert one == frozen_names(model) and not embedding.requires_grad
    both = set(freeze_first_layers(model, 2, "MLM_FREEZE_LAYERS")) | one
    assert len(both) > len(one)  # the second layer's parameters too
    assert any(p.requires_grad for p in head_parameters(model))  # the head still trains


def test_the_head_is_every_parameter_outside_the_encoder() -> None:
    model = tiny_bert()
    names = {n for n, p in model.named_parameters() if any(p is q for q in head_parameters(model))}
    assert names and all(n.startswith("cls.") for n in names)
    decoder = model.get_output_embeddings().weight
    assert not any(decoder is p for p in head_parameters(model))  # tied: the word embeddings', the encoder's


def test_the_head_gets_its_own_rate_and_the_schedule_scales_both() -> None:
    model = tiny_bert()
    head = tuple(head_parameters(model))
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in model.named_parameters() if "bias" not in n], "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if "bias" in n], "weight_decay": 0.0},
        ],
        lr=1e-4,
    )
    with_head_rate(optimizer, head, 1e-3)
    rates = sorted((g["lr"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups)
    assert [r[:2] for r in rates] == [(1e-4, 0.0), (1e-4, 0.01), (1e-3, 0.0), (1e-3, 0.01)]
    assert sum(r[2] for r in rates) == len(list(model.parameters()))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert sorted({g["lr"] for g in optimizer.param_groups}) == [5e-5, 5e-4]
    del scheduler


def test_the_warm_up_drops_the_encoders_gradients_until_its_last_step_resumed_or_not(tmp_path: Path) -> None:
    """The Trainer's step counter decides: a run resumed at step 1 of a 2-step warm-up is still frozen."""
    from transformers import TrainingArguments

    model = tiny_bert()
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], max_steps=3)
    head = tuple(head_parameters(model))
    frozen = tuple(p for p in model.parameters() if all(p is not q for q in head))
    trainer = MLMTrainer(model=model, args=args, settings=trainer_settings(head=HeadTraining(head, None, 2, frozen)))
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before its steps
    ids = torch.randint(5, 64, (2, 8))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    for step, frozen in ((1, True), (2, False)):
        model.zero_grad(set_to_none=True)
        trainer.state.global_step = step  # as a resumed checkpoint sets it
        trainer.training_step(model, inputs)
        encoder = model.bert.encoder.layer[0].attention.self.query.weight
        assert (encoder.grad is None) is frozen
        assert model.cls.predictions.transform.dense.weight.grad is not None


def test_the_drift_is_measured_for_a_pretrained_model_with_held_out_rows() -> None:
    from train.run.adapting import drift_batch

    model, examples = tiny_bert(), [{"input_ids": [2, 7, 9, 3]}]
    batch = drift_batch(model, examples, None, scratch=False)
    assert batch is not None and batch["input_ids"].tolist() == [[2, 7, 9, 3]]
    assert drift_batch(model, examples, 0, scratch=True) is None  # from scratch: nothing to move away from
    assert drift_batch(model, None, 0, scratch=False) is None  # nothing evaluated


def test_drift_is_one_at_the_start_and_warned_of_when_the_encoder_moves(capsys: pytest.CaptureFixture) -> None:
    model = tiny_bert()
    examples = [{"input_ids": [2, 7, 9, 3]}, {"input_ids": [2, 11, 3]}, {"input_ids": []}]
    batch = held_out_batch(examples, 64, pad_id=0)
    assert batch is not None and batch["input_ids"].shape == (2, 4) and batch["attention_mask"].sum() == 7
    drift = EncoderDrift(model, batch)
    step = [0]
    metrics = drift.alongside(lambda _: {"accuracy": 0.5}, lambda: step[0])
    assert metrics(None) == {"accuracy": 0.5, "encoder_cosine": pytest.approx(1.0, abs=1e-5)}
    assert "encoder moved" not in capsys.readouterr().err
    with torch.no_grad():
        for parameter in model.bert.parameters():
            parameter.add_(torch.randn_like(parameter) * 2)
    assert drift.cosine() < DRIFT_WARNING
    drift.cosine()
    said = capsys.readouterr().err
    assert said.count("the encoder moved far from the model handed over: eval_encoder_cosine") == 1
    assert "head_warmup_steps" in said and "freeze_layers" in said
    # Measured once a step: a mixture's sources each call compute_metrics on the same weights.
    assert metrics(None)["encoder_cosine"] == pytest.approx(1.0, abs=1e-5)
    step[0] = 1
    assert metrics(None)["encoder_cosine"] < DRIFT_WARNING


def test_adapting_options_refused_from_scratch_and_under_fsdp() -> None:
    scratch = load_config([], {"MLM_MODEL_NAME_OR_PATH": "scratch:bert", "MLM_FREEZE_LAYERS": "2"})
    with pytest.raises(ConfigError, match=r"^MLM_FREEZE_LAYERS=2: adapts a pretrained model, and MLM_MODEL_NAME"):
        check_adapting(scratch.adapting, scratch.model, scratch=True)
    rated = load_config([], {"MLM_HEAD_LEARNING_RATE": "1e-3"})
    check_adapting(rated.adapting, rated.model, scratch=True)  # a rate of its own: fine
    sharded = load_config([], {"MLM_SHARDING": "fsdp", "MLM_HEAD_WARMUP_STEPS": "5"})
    with pytest.raises(ConfigError, match=r"^MLM_SHARDING=fsdp: MLM_HEAD_WARMUP_STEPS is not supported under fsdp"):
        check_sharding(sharded.launch, sharded.training, sharded.adapting)
    with pytest.raises(ConfigError, match=r"^MLM_FREEZE_LAYERS=-1: expected an integer >= 0"):
        load_config([], {"MLM_FREEZE_LAYERS": "-1"})


def test_two_ranks_warm_the_head_up_with_the_encoder_untouched(tmp_path: Path) -> None:
    """A real DDP run (gloo, two ranks) of a handed-over encoder without its head, warmed up for all its steps:
    it trains (the head changes), the encoder's weights are exactly those handed over, and run.json's results
    hold eval_encoder_cosine (1: it did not move)."""
    encoder = tmp_path / "encoder"
    vocab = tmp_path / "vocab.txt"
    words = sorted({w.strip(".,").lower() for w in "This is a training sample for multi-GPU demonstration".split()})
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    sizes = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    BertModel(BertConfig(vocab_size=5 + len(words), **sizes)).save_pretrained(encoder)
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(encoder)
    output = tmp_path / "out"
    options = {"model_name_or_path": str(encoder), "config_overrides": "", "demo_samples": "64", "max_steps": "3"}
    env = tiny_env(output, **options, head_warmup_steps="3", head_learning_rate="1e-2")
    done = run_torchrun(env, 2, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    start, final = BertModel.from_pretrained(encoder), AutoModelForMaskedLM.from_pretrained(output / "final")
    handed_over = start.state_dict()
    for name, parameter in final.bert.state_dict().items():  # its pooler aside: a masked LM has none
        assert torch.equal(parameter, handed_over[name]), name
    assert final.cls.predictions.bias.abs().sum() > 0  # the new head's bias starts at zero: it trained
    results = json.loads((output / "all_results.json").read_text())
    assert results["eval_encoder_cosine"] == pytest.approx(1.0, abs=1e-5)
    curve = json.loads((output / "run.json").read_text())["quality_curve"]
    assert curve[-1]["eval_encoder_cosine"] == results["eval_encoder_cosine"]  # the final evaluation's


def test_a_new_head_warms_up_alone_by_default_for_the_learning_rates_warm_up(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """head_warmup_steps unset: a pretrained model's new head trains alone for the learning rate's warm-up (known
    at the first step); a whole head, a model from scratch, or head_warmup_steps=0 warm nothing up alone."""
    from transformers import TrainingArguments

    from train.run.adapting import AUTO_WARMUP, head_training

    def adapted(new_head: bool, scratch: bool = False, **env: str) -> HeadTraining:
        config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(tmp_path), **env})
        return head_training(config.adapting, tiny_bert(), scratch, new_head)

    assert adapted(new_head=True).warmup_steps == AUTO_WARMUP
    assert adapted(new_head=False).warmup_steps == 0 and adapted(new_head=False).frozen == ()
    assert adapted(new_head=True, scratch=True).warmup_steps == 0
    assert adapted(new_head=True, MLM_HEAD_WARMUP_STEPS="0").warmup_steps == 0
    assert adapted(new_head=False, MLM_HEAD_WARMUP_STEPS="5").warmup_steps == 5

    config = load_config([], {"MLM_MODEL_NAME_OR_PATH": str(tmp_path)})  # before the Trainer: it resets accelerate
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], max_steps=40, warmup_steps=0.1)
    model = tiny_bert()
    settings = trainer_settings(head=head_training(config.adapting, model, False, True))
    trainer = MLMTrainer(model=model, args=args, settings=settings)
    trainer.current_gradient_accumulation_steps = 1
    trainer.state.max_steps, trainer.state.global_step = 40, 0
    ids = torch.randint(5, 64, (2, 8))
    trainer.training_step(trainer.model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    assert trainer.head_warmup_steps == 4  # a tenth of the 40 steps
    assert trainer.model.bert.encoder.layer[0].attention.self.query.weight.grad is None  # frozen at step 0
    assert "the MLM head is new: it trains alone, the encoder frozen, for the learning rate's 4 warm-up steps" in (
        capsys.readouterr().err
    )
