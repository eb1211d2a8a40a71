"""``finetune``: a model fine-tuned on a labelled task over seeds and scored, in this process (a tiny DistilBERT and
a WordPiece tokenizer built here; the task: lines of two licences, labelled by licence), its bad input refused in
one line before training, its scores agreeing with scikit-learn's (the run through ./entrypoint.sh:
tests/e2e/test_finetune.py)."""

from __future__ import annotations

import gzip
import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import DistilBertConfig, DistilBertForMaskedLM, PreTrainedTokenizerFast

from train.commands.finetune.command import FINETUNE_RESULTS, main
from train.commands.finetune.scores import classification_scores, summary
from train.common.errors import ConfigError
from train.data.tasks import TaskColumns, read_task

LICENSES = Path("/usr/share/common-licenses")  # base-files: on every Debian and Ubuntu system
CLASSES = {"apache": "Apache-2.0", "gpl": "GPL-3"}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The fixed recipe's settings kept small: one epoch, two seeds.
TINY = ["--task_epochs", "1", "--task_seeds", "2", "--dataloader_num_workers", "0", "--log_format", "text"]


def sentences(name: str) -> list[str]:
    """A licence's lines of six words or more, whitespace collapsed, in a fixed shuffled order."""
    lines = [" ".join(line.split()) for line in (LICENSES / name).read_text(encoding="utf-8").splitlines()]
    kept = [line for line in lines if len(line.split()) >= 6]
    random.Random(0).shuffle(kept)
    return kept


def build_model(directory: Path) -> Path:
    """A 2-layer DistilBERT masked LM (random weights: a "final model" to fine-tune) and its WordPiece tokenizer,
    saved as a final/ directory is."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    lines = [line for name in CLASSES.values() for line in sentences(name)]
    tokenizer.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=600, special_tokens=SPECIAL))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=64,
    )
    config = DistilBertConfig(
        vocab_size=len(fast), n_layers=2, n_heads=2, dim=32, hidden_dim=64, max_position_embeddings=64, pad_token_id=0
    )
    DistilBertForMaskedLM(config).save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def write_rows(directory: Path, split: str, rows: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_task(directory: Path, per_class: int = 24, test_per_class: int = 8) -> Path:
    """Lines of the Apache and GPL licences labelled by licence: ``per_class`` of each to train on, then
    ``test_per_class`` more to test on."""
    rows: dict[str, list[dict]] = {"train": [], "test": []}
    for label, name in CLASSES.items():
        lines = sentences(name)
        rows["train"] += [{"text": text, "label": label} for text in lines[:per_class]]
        rows["test"] += [{"text": text, "label": label} for text in lines[per_class : per_class + test_per_class]]
    for split, split_rows in rows.items():
        write_rows(directory, split, split_rows)
    return directory


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("model") / "final")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task(tmp_path_factory.mktemp("task") / "licences")


def finetuned(model: Path, task: Path, output: Path, *extra: str) -> dict:
    assert (
        main(["--model_name_or_path", str(model), "--task", str(task), "--output_dir", str(output), *TINY, *extra]) == 0
    )
    return json.loads((output / FINETUNE_RESULTS).read_text())


def test_the_results_hold_every_seed_their_mean_and_spread_and_the_recipe(
    model: Path, task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = finetuned(model, task, tmp_path / "out", "--task_baselines", "true")
    assert (results["model"], results["task"], results["labels"], results["pair"]) == (
        str(model),
        str(task),
        ["apache", "gpl"],
        False,
    )
    assert (results["train_examples"], results["test_examples"], results["world_size"]) == (48, 16, 1)
    assert results["recipe"] == {
        "learning_rate": 1e-4,
        "epochs": 1,
        "seeds": [0, 1],
        "max_length": 64,  # the tokenizer's and the model's limit, below max_seq_length's 128
        "batch_size": 32,
        "per_device_batch_size": 32,
        "warmup_ratio": 0.1,
        "lr_scheduler": "linear",
        "weight_decay": 0.01,
        "optimizer": "adamw_torch",
    }
    assert "classifier.weight" in results["new_weights"] and not any("distilbert." in w for w in results["new_weights"])
    for kind in ("pretrained", "baseline"):
        runs = results[kind]["seeds"]
        assert [run["seed"] for run in runs] == [0, 1]
        for run in runs:
            assert {"accuracy", "macro_f1", "mcc", "train_loss", "seconds"} <= run.keys()
            assert 0 <= run["accuracy"] <= 1 and -1 <= run["mcc"] <= 1 and run["train_loss"] > 0
        accuracies = [run["accuracy"] for run in runs]
        assert results[kind]["mean"]["accuracy"] == pytest.approx(np.mean(accuracies))
        assert results[kind]["std"]["accuracy"] == pytest.approx(np.std(accuracies, ddof=1))
    assert results["pretrained"]["seeds"] != results["baseline"]["seeds"]  # other weights, other scores or losses
    assert results["wall_time_s"] > 0
    err = capsys.readouterr().err
    assert err.count("finetune pretrained seed") == 2 and err.count("finetune baseline seed") == 2
    assert f"written to {tmp_path / 'out'}/{FINETUNE_RESULTS}" in err and "random-init baseline: accuracy" in err
    assert not list((tmp_path / "out").glob("checkpoint-*"))  # nothing but the results is written


def test_the_same_seed_gives_the_same_scores(model: Path, task: Path, tmp_path: Path) -> None:
    first = finetuned(model, task, tmp_path / "a", "--task_seeds", "1")["pretrained"]["seeds"][0]
    again = finetuned(model, task, tmp_path / "b", "--task_seeds", "1")["pretrained"]["seeds"][0]
    assert {k: v for k, v in first.items() if k != "seconds"} == {k: v for k, v in again.items() if k != "seconds"}


def test_a_pair_task_is_read_as_pairs_and_scored(model: Path, tmp_path: Path) -> None:
    """Does the second line come from the same licence as the first? Only the pair tells."""
    apache, gpl = sentences("Apache-2.0"), sentences("GPL-3")
    rows = [{"premise": apache[i], "hypothesis": (apache if i % 2 else gpl)[i + 1], "label": i % 2} for i in range(40)]
    write_rows(tmp_path / "pairs", "train", rows[:32])
    write_rows(tmp_path / "pairs", "test", rows[32:])
    columns = ["--task_text_column", "premise", "--task_text_pair_column", "hypothesis"]
    results = finetuned(model, tmp_path / "pairs", tmp_path / "out", *columns, "--task_seeds", "1")
    assert results["pair"] is True and results["labels"] == ["0", "1"]  # integers, their ids in sorted order
    assert {"accuracy", "macro_f1", "mcc"} <= results["pretrained"]["seeds"][0].keys()
    read = read_task(str(tmp_path / "pairs"), TaskColumns(text="premise", pair="hypothesis"))
    assert read.train.column_names == ["text", "text_pair", "labels"] and read.train["labels"][:2] == [0, 1]


def test_labels_become_ids_in_sorted_order_and_a_single_text_task_ignores_an_absent_pair(tmp_path: Path) -> None:
    write_rows(tmp_path, "train", [{"text": "a", "label": "pos"}, {"text": "b", "label": "neg"}])
    write_rows(tmp_path, "test", [{"text": "c", "label": "pos"}])
    read = read_task(str(tmp_path), TaskColumns())
    assert (read.labels, read.pair, read.train["labels"], read.test["labels"]) == (("neg", "pos"), False, [1, 0], [1])


@pytest.mark.parametrize("suffix", ["csv", "parquet", "jsonl.gz"])
def test_every_format_reads_the_same_task(tmp_path: Path, suffix: str) -> None:
    rows = {"text": ["one", "two", "three"], "label": [3, -1, 3]}
    for split in ("train", "test"):
        Dataset.from_dict(rows).to_json(tmp_path / f"{split}.jsonl")
        if suffix == "csv":
            Dataset.from_dict(rows).to_csv(tmp_path / f"{split}.csv", index=False)
        elif suffix == "parquet":
            Dataset.from_dict(rows).to_parquet(tmp_path / f"{split}.parquet")
        else:
            (tmp_path / f"{split}.jsonl.gz").write_bytes(gzip.compress((tmp_path / f"{split}.jsonl").read_bytes()))
        (tmp_path / f"{split}.jsonl").unlink()
    read = read_task(str(tmp_path), TaskColumns())
    assert read.files["train"].endswith(f"train.{suffix}")
    assert (read.labels, read.train["text"], read.train["labels"]) == (("-1", "3"), ["one", "two", "three"], [1, 0, 1])


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("no test file", r"--task='.*': no test file there; expected test\.csv, \.jsonl, \.json or \.parquet$"),
        (
            "no label column",
            r"train\.jsonl: no column 'label' \(columns: text, category\); set task_label_column to the column",
        ),
        (
            "one class",
            r"train\.jsonl: column 'label' holds one class \('apache'\) in all 48 rows; expected at least two",
        ),
        ("unseen test label", r"test\.jsonl: label 'mit' is not among train\.jsonl's labels \('apache', 'gpl'\)"),
        (
            "named pair column missing",
            r"train\.jsonl: no column 'second' \(columns: text, label\); set --task_text_pair_column",
        ),
        ("not a directory", r"--task='.*nowhere': no such directory; expected a local directory"),
    ],
)
def test_bad_input_is_one_line_naming_the_file_or_option_before_training(
    model: Path, tmp_path: Path, damage: str, expected: str
) -> None:
    task = write_task(tmp_path / "task")
    extra: list[str] = []
    rows = [json.loads(line) for line in (task / "train.jsonl").read_text().splitlines()]
    if damage == "no test file":
        (task / "test.jsonl").unlink()
    elif damage == "no label column":
        write_rows(task, "train", [{"text": row["text"], "category": row["label"]} for row in rows])
    elif damage == "one class":
        write_rows(task, "train", [{**row, "label": "apache"} for row in rows])
    elif damage == "unseen test label":
        write_rows(task, "test", [{"text": "Permission is hereby granted, free of charge", "label": "mit"}])
    elif damage == "named pair column missing":
        extra = ["--task_text_pair_column", "second"]
    else:
        task = tmp_path / "nowhere"
    started = time.monotonic()
    with pytest.raises(ConfigError, match=expected) as refused:
        main(["--model_name_or_path", str(model), "--task", str(task), "--output_dir", str(tmp_path / "out"), *extra])
    assert "\n" not in str(refused.value)
    assert time.monotonic() - started < 10  # refused on reading, not after a fine-tuning
    assert not (tmp_path / "out" / FINETUNE_RESULTS).exists()


def test_a_model_to_train_from_scratch_is_refused(task: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--model_name_or_path='scratch:distilbert': finetune needs a trained model"):
        main(["--model_name_or_path", "scratch:distilbert", "--task", str(task), "--output_dir", str(tmp_path)])


@pytest.mark.parametrize("seed", range(5))
def test_the_scores_agree_with_scikit_learn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for labels in (2, 3):
        true, predicted = rng.integers(0, labels, 50), rng.integers(0, labels, 50)
        predicted[:3] = true[:3]
        scores = classification_scores(predicted, true, labels)
        assert scores["accuracy"] == pytest.approx(accuracy_score(true, predicted))
        assert scores["macro_f1"] == pytest.approx(f1_score(true, predicted, average="macro"))
        if labels == 2:
            assert scores["mcc"] == pytest.approx(matthews_corrcoef(true, predicted))
            for positive in (0, 1):  # GLUE's MRPC and QQP score: F1 of one class
                f1 = classification_scores(predicted, true, labels, positive)["f1"]
                assert f1 == pytest.approx(f1_score(true, predicted, pos_label=positive))
        else:
            assert "mcc" not in scores
    constant = classification_scores(np.zeros(10, dtype=int), np.array([0, 1] * 5), 2)
    assert constant["mcc"] == 0.0 and constant["accuracy"] == 0.5  # the majority answer carries no information


def test_one_seed_has_a_mean_but_no_spread() -> None:
    assert summary([{"accuracy": 0.5, "macro_f1": 0.4}]) == {
        "mean": {"accuracy": 0.5, "macro_f1": 0.4},
        "std": {"accuracy": None, "macro_f1": None},
    }
