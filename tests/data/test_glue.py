"""GLUE's tasks by name (train/data/glue.py): from a hub on loopback speaking the download API (tests/hub_server.py),
then offline from its cache, and from a local copy in the GLUE layout; both read into the same task, and finetune
scores a GLUE task with GLUE's metric."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest
from datasets import ClassLabel, Dataset, Features, Value

from tests.commands.finetune.test_command import TINY, build_model, sentences
from tests.hub_server import HubServer
from train.commands.finetune.command import FINETUNE_RESULTS, main
from train.common.errors import ConfigError
from train.config import load_config
from train.data.glue import HUB_DATASET, TASKS
from train.data.tasks import LABEL, PAIR, TEXT, Task, load_task

# Sentences of two licences stand in for GLUE's text: the labels are GLUE's classes, the words are not.
APACHE, GPL = sentences("Apache-2.0"), sentences("GPL-3")


def rows(split: str, pair: bool) -> list[tuple[str, str | None, int]]:
    """(text, pair text, class id): class 1 from the Apache licence, class 0 from the GPL; 12 and 4 of each."""
    start, count = (0, 12) if split == "train" else (12, 4)
    chosen = [(APACHE[i], APACHE[i + 40], 1) for i in range(start, start + count)]
    chosen += [(GPL[i], GPL[i + 40], 0) for i in range(start, start + count)]
    return [(text, second if pair else None, label) for text, second, label in chosen]


def parquet(name: str, split: str, part: slice = slice(None)) -> bytes:
    """A split (``part`` of its rows: a shard) as the hub's nyu-mll/glue holds it: parquet with the label a
    ClassLabel of GLUE's class names."""
    task = TASKS[name]
    data = rows(split, task.pair is not None)[part]
    columns: dict[str, list] = {task.text: [r[0] for r in data]}
    features = {task.text: Value("string")}
    if task.pair:
        columns[task.pair], features[task.pair] = [r[1] for r in data], Value("string")
    columns["label"], features["label"] = [r[2] for r in data], ClassLabel(names=list(task.classes))
    columns["idx"], features["idx"] = list(range(len(data))), Value("int32")
    buffer = io.BytesIO()
    Dataset.from_dict(columns, features=Features(features)).to_parquet(buffer)
    return buffer.getvalue()


def glue_download(root: Path) -> Path:
    """SST-2, CoLA (no header line), MRPC and MNLI folders as GLUE's download_glue_data.py writes them."""
    for split, file in (("train", "train.tsv"), ("test", "dev.tsv")):
        sst = root / "SST-2"
        sst.mkdir(parents=True, exist_ok=True)
        (sst / file).write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, _, y in rows(split, False)))
        cola = root / "CoLA"
        cola.mkdir(exist_ok=True)
        (cola / file).write_text("".join(f"gj04\t{y}\t{'' if y else '*'}\t{t}\n" for t, _, y in rows(split, False)))
        mrpc = root / "MRPC"
        mrpc.mkdir(exist_ok=True)
        lines = "".join(f"{y}\t1\t2\t{a}\t{b}\n" for a, b, y in rows(split, True))
        (mrpc / file).write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + lines + "1\t3\ttoo short\n")
        mnli = root / "MNLI"
        mnli.mkdir(exist_ok=True)
        name = "dev_matched.tsv" if split == "test" else file
        classes = ("contradiction", "entailment")
        lines = "".join(f"{i}\t{a}\t{b}\t{classes[y]}\n" for i, (a, b, y) in enumerate(rows(split, True)))
        (mnli / name).write_text("index\tsentence1\tsentence2\tgold_label\n" + lines)
    return root


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        yield server


@pytest.fixture
def online(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubServer:
    """The loopback hub holding nyu-mll/glue's SST-2, MRPC and CoLA files; an empty hub cache; no token."""
    hub.reset()
    files = {f"{n}/train-00000-of-00001.parquet": parquet(n, "train") for n in ("sst2", "cola")}
    files |= {f"{n}/validation-00000-of-00001.parquet": parquet(n, "test") for n in ("sst2", "mrpc", "cola")}
    for shard, part in enumerate((slice(0, 10), slice(10, None))):  # a large split comes in shards
        files[f"mrpc/train-0000{shard}-of-00002.parquet"] = parquet("mrpc", "train", part)
    hub.add(HUB_DATASET, "dataset", {**files, "README.md": b"# GLUE\n"})
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # the constants are read at import
    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return hub


def task_of(task: str, *flags: str) -> Task:
    return load_task(load_config(["--task", task, *flags], {}).task)


def as_rows(task: Task) -> dict[str, list]:
    return {split: getattr(task, split).to_dict() for split in ("train", "test")}


def test_a_glue_task_by_name_comes_from_the_hub_then_from_its_cache_offline(
    online: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = task_of("glue:sst2")
    assert task.labels == ("negative", "positive") and not task.pair and task.glue == TASKS["sst2"]
    assert len(task.train) == 24 and len(task.test) == 8
    assert task.train[0] == {TEXT: APACHE[0], LABEL: 1}  # the ClassLabel's names, sorted: positive is id 1
    fetched = {r.path for r in online.requests if "/resolve/" in r.path and r.method == "GET"}
    assert fetched == {
        f"/datasets/{HUB_DATASET}/resolve/{online.repos[HUB_DATASET].sha}/sst2/{s}-00000-of-00001.parquet"
        for s in ("train", "validation")
    }  # the task's two files, not the rest of GLUE

    online.reset()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert as_rows(task_of("glue:SST-2")) == as_rows(task) and online.requests == []

    local = glue_download(tmp_path / "glue_data")
    assert as_rows(task_of(str(local / "SST-2"))) == as_rows(task)  # a local copy is the same task


def test_a_pair_task_scores_glues_f1_of_its_positive_class(online: HubServer, tmp_path: Path) -> None:
    task = task_of("glue:mrpc")
    assert task.pair and task.labels == ("equivalent", "not_equivalent") and task.positive == 0
    assert len(task.train) == 24 and "train-00000-of-00002" in task.files["train"]  # both shards
    assert set(task.train.column_names) == {TEXT, PAIR, LABEL}
    model = build_model(tmp_path / "model")
    output = tmp_path / "out"
    flags = ["--model_name_or_path", str(model), "--task", "glue:mrpc", "--output_dir", str(output), *TINY]
    assert main(flags) == 0
    results = json.loads((output / FINETUNE_RESULTS).read_text())
    assert results["glue"] == {"task": "mrpc", "metric": "f1", "scored_on": "validation"}
    assert {"accuracy", "macro_f1", "mcc", "f1"} <= set(results["pretrained"]["mean"])
    assert all(0.0 <= seed["f1"] <= 1.0 for seed in results["pretrained"]["seeds"])


def test_a_glue_download_is_read_as_glues_readers_read_it(tmp_path: Path) -> None:
    root = glue_download(tmp_path / "glue_data")
    cola = task_of(str(root / "CoLA"))  # no header: the label is the second field, the sentence the fourth
    assert cola.labels == ("acceptable", "unacceptable") and cola.glue is not None and cola.glue.metric == "mcc"
    assert cola.train[0] == {TEXT: APACHE[0], LABEL: 0}
    mrpc = task_of(str(root / "MRPC"))
    assert len(mrpc.train) == 24  # GLUE's broken short line left out, as its readers leave it
    assert mrpc.train[0] == {TEXT: APACHE[0], PAIR: APACHE[40], LABEL: 0}  # equivalent (1) is id 0 of the names
    mnli = task_of(str(root / "MNLI"))
    assert mnli.files["test"].endswith("MNLI/dev_matched.tsv") and mnli.labels == ("contradiction", "entailment")


@pytest.mark.parametrize(
    ("task", "flags", "message"),
    [
        ("glue:stsb", [], r"--task='glue:stsb': GLUE's stsb is a regression target .*; expected one of glue:cola"),
        ("glue:ax", [], r"GLUE's ax is a test set only, without labels, not a classification task"),
        ("glue:nope", [], r"--task='glue:nope': no such GLUE task; expected one of glue:cola, glue:sst2"),
        ("glue:sst2", ["--task_text_column", "review"], r"--task_text_column: GLUE's SST-2 names its own columns"),
    ],
)
def test_a_glue_task_that_cannot_be_is_one_line(task: str, flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        task_of(task, *flags)


def test_a_glue_download_with_another_label_or_header_is_one_line_naming_the_file(tmp_path: Path) -> None:
    root = glue_download(tmp_path / "glue_data")
    (root / "SST-2" / "dev.tsv").write_text("sentence\tlabel\nfine\t7\n")
    with pytest.raises(ConfigError, match=r"SST-2/dev.tsv: label '7' is not one of GLUE SST-2's \(negative, posi"):
        task_of(str(root / "SST-2"))
    (root / "MRPC" / "train.tsv").write_text("Quality\tfirst\tsecond\n1\ta\tb\n")
    with pytest.raises(ConfigError, match=r"MRPC/train.tsv: no column '#1 String' in its header .*GLUE's MRPC"):
        task_of(str(root / "MRPC"))


def test_an_unreachable_hub_says_to_mount_a_copy_in_the_glue_layout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # discard: nothing answers
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ConfigError) as raised:
        task_of("glue:rte")
    text = str(raised.value)
    assert text.startswith("--task=glue:rte: nyu-mll/glue could not be fetched: the hub did not answer (") and (
        "\n" not in text
    )
    assert text.endswith("or put GLUE's RTE folder (train.tsv, dev.tsv, as download_glue_data.py writes it) on a "
                         "volume and set --task to it")  # fmt: skip
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ConfigError, match=r"could not be fetched: HF_HUB_OFFLINE is set and its mnli files are not in "
    ):
        task_of("glue:mnli")
