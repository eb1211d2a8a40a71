"""train.data.stream: a stream split across ranks, resumed exactly, and its position saved with each checkpoint."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.data.helpers import config_for, write_shards
from tests.helpers import Payload
from train.common.errors import ConfigError, EnvironmentProblem
from train.data import (
    SAMPLE_INDEX,
    StreamPosition,
    content_index,
    load_raw,
    own_loader_state,
    stream_training_overrides,
    tokenized_stream,
)
from train.data.stream import StreamLoader
from train.data.stream_resume import rank_position
from train.model.tokenizer_training import train_tokenizer
from train.outputs.runfiles import STREAM_STATE, RunFiles


def prepared(source: Path, **env: str):
    """A streaming config for ``source``, its stream and a tokenizer trained on the stream's sample."""
    config = config_for(str(source), streaming="true", max_steps="10", max_eval_samples="4", max_seq_length="32", **env)
    raw = load_raw(config.data, config.training)
    assert raw.stream is not None
    return config, raw.stream, train_tokenizer(raw, config.model, config.data)


def examples_of(source: Path, rank: int, world: int) -> list[list[int]]:
    config, stream, tokenizer = prepared(source)
    return [row["input_ids"] for row in tokenized_stream(config.data, stream, tokenizer, rank, world)]


@pytest.mark.parametrize("shards", [4, 3])  # whole files per rank; every other example when they do not divide
def test_ranks_read_disjoint_parts_that_cover_the_stream(tmp_path: Path, shards: int) -> None:
    write_shards(tmp_path / "corpus", shards=shards, per_shard=12)
    everything = examples_of(tmp_path / "corpus", 0, 1)
    parts = [examples_of(tmp_path / "corpus", rank, 2) for rank in (0, 1)]
    assert sorted(map(tuple, parts[0] + parts[1])) == sorted(map(tuple, everything))
    assert not set(map(tuple, parts[0])) & set(map(tuple, parts[1]))


@pytest.mark.parametrize("padding", ["dynamic", "packed"])
def test_a_batch_with_every_line_held_out_is_skipped_not_a_crash(tmp_path: Path, padding: str) -> None:
    """The evaluation set is held out of the stream by its text: a batch of only those lines keeps nothing."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("the same line again\n" * 1200 + "another line of text\n" * 8)
    config, stream, tokenizer = prepared(tmp_path / "corpus", padding=padding)
    assert "the same line again" in stream.held_out
    rows = list(tokenized_stream(config.data, stream, tokenizer, 0, 1))
    assert 0 < len(rows) <= 8 and all(row["input_ids"] for row in rows)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("padding", ["dynamic", "packed"])
def test_a_resumed_stream_sees_exactly_the_examples_an_uninterrupted_one_sees(
    tmp_path: Path, workers: int, padding: str
) -> None:
    """The position a checkpoint saves (StatefulDataLoader.state_dict) continues the stream with no example
    repeated or skipped, DataLoader workers included."""
    write_shards(tmp_path / "corpus", shards=2, per_shard=40)

    def loader(state=None):
        config, stream, tokenizer = prepared(tmp_path / "corpus", padding=padding)
        data = tokenized_stream(config.data, stream, tokenizer, 0, 1)
        made = StatefulDataLoader(data, batch_size=4, collate_fn=lambda rows: rows, num_workers=workers)
        if state is not None:
            made.load_state_dict(state)
        return made

    def indices(batches) -> list[int]:
        return [row[SAMPLE_INDEX] for batch in batches for row in batch]

    straight = indices(loader())
    assert len(straight) > 12 and len(set(straight)) == len(straight)
    first = loader()
    seen = []
    for n, batch in enumerate(first):
        seen.append(batch)
        if n == 2:
            break
    state = first.state_dict()
    assert indices(seen) + indices(loader(state)) == straight


def test_a_stream_examples_index_is_its_content() -> None:
    assert content_index([1, 2, 3]) == content_index([1, 2, 3]) != content_index([1, 2, 4])
    assert 0 <= content_index(list(range(512))) < 2**63


NUMBERS = datasets.Dataset.from_dict({"n": list(range(30))}).to_iterable_dataset(num_shards=2)


def number_loader(workers: int) -> StreamLoader:
    """A rank's loader over 30 numbers in two files, in batches of 3."""
    return StreamLoader(NUMBERS, batch_size=3, num_workers=workers, collate_fn=lambda rows: [r["n"] for r in rows])


def three_batches_in(workers: int) -> tuple[StreamLoader, list[list[int]]]:
    """A loader that has yielded three batches, and the batches an uninterrupted one yields after them."""
    straight, loader = list(number_loader(workers)), number_loader(workers)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    return loader, straight[3:]


def saving_args(output_dir: Path) -> SimpleNamespace:
    return SimpleNamespace(output_dir=str(output_dir), process_index=0, world_size=1, per_device_train_batch_size=3)


def saved_at_step_10(output_dir: Path, loader: StreamLoader) -> Path:
    """``loader``'s position saved as the checkpoint of step 10 saves it; the checkpoint."""
    checkpoint = RunFiles(output_dir).checkpoint(10)
    checkpoint.mkdir(parents=True)
    StreamPosition().on_save(saving_args(output_dir), SimpleNamespace(global_step=10), None, train_dataloader=loader)
    return checkpoint


def test_the_position_is_saved_into_the_checkpoint_and_read_back(tmp_path: Path) -> None:
    loader, _ = three_batches_in(workers=0)
    files = RunFiles(tmp_path)
    saved = saved_at_step_10(tmp_path, loader) / STREAM_STATE
    state = json.loads(json.dumps(loader.state_dict()))
    position = {"kind": "rank", "rank": 0, "world_size": 1, "batch_size": 3, "workers": 0, "loader": state}
    assert json.loads(saved.read_text()) == {"world_size": 1, "ranks": [{**position, "used": 0}]}
    assert not list(files.checkpoint(10).glob("*.tmp"))  # written whole, then renamed into place
    assert StreamPosition.load(str(files.checkpoint(10)), 0, 1, "MLM_STREAMING") == {**position, "used": 0}
    # on two ranks, both share the one old rank's remainder, every other example (train/data/stream_resume.py)
    shared = StreamPosition.load(str(files.checkpoint(10)), 1, 2, "MLM_STREAMING")
    assert shared == {"kind": "stride", "part": {**position, "used": 0}, "every": 2, "skip": 1}
    StreamPosition().on_save(saving_args(tmp_path), SimpleNamespace(global_step=20), None, train_dataloader=loader)
    assert not files.checkpoint(20).exists()  # no checkpoint at that step: nothing is created
    files.checkpoint(30).mkdir()
    assert StreamPosition.load(str(files.checkpoint(30)), 0, 1, "MLM_STREAMING") is None  # saved before streaming
    (files.checkpoint(30) / STREAM_STATE).write_text('{"world_size": 1, "ranks": [{"read": 7}]}')  # whose is it?
    with pytest.raises(ConfigError, match=r"MLM_STREAMING=true: checkpoint-30/stream_state.json is damaged"):
        StreamPosition.load(str(files.checkpoint(30)), 0, 1, "MLM_STREAMING")
    out_of_range = {"world_size": 1, "ranks": [{**position, "used": -3}]}
    (files.checkpoint(30) / STREAM_STATE).write_text(json.dumps(out_of_range))
    with pytest.raises(ConfigError, match=r"damaged \(ranks\[0\]\.used: -3 is not a whole number from 0 to 3\)$"):
        StreamPosition.load(str(files.checkpoint(30)), 0, 1, "MLM_STREAMING")
    (files.checkpoint(30) / STREAM_STATE).write_text(json.dumps({"world_size": 2, "ranks": [position]}))
    with pytest.raises(ConfigError, match=r"as many as its world_size"):
        StreamPosition.load(str(files.checkpoint(30)), 0, 1, "MLM_STREAMING")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_saved_position_read_back_resumes_the_stream_where_it_stopped(tmp_path: Path, workers: int) -> None:
    loader, after = three_batches_in(workers)
    checkpoint = saved_at_step_10(tmp_path, loader)
    position = StreamPosition.load(str(checkpoint), 0, 1, "MLM_STREAMING")
    assert position is not None
    resumed = number_loader(workers)
    resumed.load_state_dict(own_loader_state(position, 0, 1, 3, workers))
    assert list(resumed) == after


@pytest.fixture(scope="module")
def saved_states() -> dict[int, dict[str, Any]]:
    """stream_state.json of a checkpoint saved three batches in, with no DataLoader workers and with two."""
    states = {}
    for workers in (0, 2):
        loader, _ = three_batches_in(workers)
        saved = {"world_size": 1, "ranks": [rank_position(loader.state_dict(), 0, 1, 3, workers)]}
        states[workers] = json.loads(json.dumps(saved))
    return states


def load_tampered(output_dir: Path, saved: dict[str, Any], path: tuple[str, ...], value: Any) -> ConfigError:
    """``saved`` with its first rank's loader state changed at ``path`` to ``value``, written as checkpoint-10's
    stream_state.json and read back: the error it is refused with."""
    tampered = copy.deepcopy(saved)
    held = tampered["ranks"][0]["loader"]
    for key in path[:-1]:
        held = held[key]
    held[path[-1]] = value
    checkpoint = RunFiles(output_dir).checkpoint(10)
    checkpoint.mkdir()
    (checkpoint / STREAM_STATE).write_text(json.dumps(tampered))
    with pytest.raises(ConfigError) as raised:
        StreamPosition.load(str(checkpoint), 0, 1, "MLM_STREAMING")
    assert raised.value.exit_code == 2
    return raised.value


YIELDED = {0: ("_num_yielded",), 2: ("_snapshot", "_snapshot_step")}  # the batches a loader has yielded
DISAGREES = {  # the count that says the same, reported when the other is raised
    0: "._sampler_iter_yielded: 3 disagrees with _num_yielded, 1000000000",
    2: "._snapshot._main_snapshot._sampler_iter_yielded: 3 disagrees with _snapshot._snapshot_step, 1000000000",
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    ("value", "said"),
    [(-1, "-1 is not a whole number from 0"), ("3", "'3' is not a whole number from 0"),
     (3.0, "3.0 is not a whole number from 0"), (True, "True is not a whole number from 0"), (10**9, None)],
)  # fmt: skip
def test_a_tampered_count_of_the_batches_yielded_is_exit_2_naming_it(
    tmp_path: Path, saved_states: dict[int, dict[str, Any]], workers: int, value: Any, said: str | None
) -> None:
    """A checkpoint's stream_state.json rewritten as an operator would (the marker's digest updated to match): a
    count below zero, of another type, or past the batches the state's other counts say were yielded."""
    refused = str(load_tampered(tmp_path, saved_states[workers], YIELDED[workers], value))
    expected = DISAGREES[workers] if said is None else f".{'.'.join(YIELDED[workers])}: {said}"
    damaged = "MLM_STREAMING=true: checkpoint-10/stream_state.json is damaged"
    assert refused.startswith(f"{damaged} (ranks[0].loader{expected}"), refused


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("_steps_since_snapshot",), 10**6, "1000000 is not 0 (our loaders snapshot at every step)"),
        (("_snapshot", "_last_yielded_worker_id"), 2, "2 is not a whole number from 0 to 1 (one of the 2 workers)"),
        (("_snapshot", "_main_snapshot", "_sampler_iter_state", "samples_yielded"), 30, "30 disagrees with"),
        (("_snapshot", "_worker_snapshots", "worker_1", "dataset_state", "epoch"), 0.0, "0.0 is not a whole number"),
        (("_snapshot", "_worker_snapshots", "worker_2"), {}, "not a field torchdata 0.11 writes"),
        (("_iterator_finished",), "no", "'no' is not true or false"),
    ],
)
def test_every_field_of_a_tampered_loader_state_is_checked(
    tmp_path: Path, saved_states: dict[int, dict[str, Any]], path: tuple[str, ...], value: Any, said: str
) -> None:
    """Beside the batches yielded: the batches torchdata would read on at load (past the end, a crash), a worker's
    id, the sampler's count, the dataset's own state (datasets' layout), a field torchdata never writes, a flag."""
    refused = str(load_tampered(tmp_path, saved_states[2], path, value))
    assert f"(ranks[0].loader.{'.'.join(path)}: {said}" in refused, refused


def test_a_torchdata_that_gives_another_layout_is_exit_3_at_the_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another torchdata under a run, whose state the layout no longer fits (a count renamed): refused where the
    position would be saved, naming what changed, rather than saved or mended by guesswork."""
    given = StatefulDataLoader.state_dict

    def renamed(loader: StatefulDataLoader) -> dict[str, Any]:
        state = given(loader)
        state["_yielded"] = state.pop("_num_yielded")
        return state

    loader, _ = three_batches_in(workers=0)
    monkeypatch.setattr(StatefulDataLoader, "state_dict", renamed)
    with pytest.raises(EnvironmentProblem) as raised:
        loader.state_dict()
    assert raised.value.exit_code == 3
    assert "(torchdata 0.11: loader._num_yielded: missing (torchdata 0.11 writes it))" in str(raised.value)


def test_a_planted_pickle_never_runs_and_a_damaged_position_is_named(tmp_path: Path) -> None:
    files, marker = RunFiles(tmp_path), tmp_path / "ran"
    checkpoint = files.checkpoint(10)
    checkpoint.mkdir()
    with (checkpoint / "stream_state.pt").open("wb") as handle:  # a pickle beside the position: never read
        pickle.dump({"world_size": 1, "ranks": [Payload(marker)]}, handle)
    assert StreamPosition.load(str(checkpoint), 0, 1, "MLM_STREAMING") is None
    (checkpoint / STREAM_STATE).write_text('{"world_size": 1, "ranks": [')  # cut off
    with pytest.raises(ConfigError, match=r"checkpoint-10/stream_state.json is damaged"):
        StreamPosition.load(str(checkpoint), 0, 1, "MLM_STREAMING")
    assert not marker.exists()


def test_only_world_rank_0_writes_the_positions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    RunFiles(tmp_path).checkpoint(5).mkdir()
    monkeypatch.setenv("RANK", "1")
    StreamPosition().on_save(
        saving_args(tmp_path), SimpleNamespace(global_step=5), None, train_dataloader=number_loader(0)
    )
    assert not (RunFiles(tmp_path).checkpoint(5) / STREAM_STATE).exists()


def test_a_stream_resumes_by_its_position_and_counts_its_tokens() -> None:
    """What the caller applies to its TrainingArguments (data/ leaves the parsed config alone)."""
    from transformers import TrainingArguments

    overrides = stream_training_overrides()
    assert overrides == {"ignore_data_skip": True, "include_num_input_tokens_seen": "non_padding"}
    assert set(overrides) <= set(TrainingArguments.__dataclass_fields__)
    training = config_for("demo", streaming="true", max_steps="3").training
    assert training.ignore_data_skip is False  # building a streamed corpus does not change it
