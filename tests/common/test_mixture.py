"""The dataset option naming several corpora (train/common/mixture.py): SOURCE=WEIGHT pairs, YAML's mapping, equal
weights, and one line for each way to get it wrong."""

from __future__ import annotations

import json

import pytest

from train.common.errors import ConfigError
from train.common.mixture import Part, dataset_names, mixture_parts


def test_weights_are_token_shares_normalised_to_one() -> None:
    parts = mixture_parts("general.jsonl=3,s3://bucket/domain/*.txt.zst=1", "MLM_DATASET")
    assert parts == (
        Part("general.jsonl", 0.75, "general"),
        Part("s3://bucket/domain/*.txt.zst", 0.25, "source"),
    )


def test_yaml_mapping_and_sources_without_weights() -> None:
    from_yaml = json.dumps({"org/wiki": 0.5, "./legal": 0.5})  # what the config layers make of a YAML mapping
    assert [(p.name, p.weight, p.key) for p in mixture_parts(from_yaml, "job.yaml: dataset") or ()] == [
        ("org/wiki", 0.5, "wiki"),
        ("./legal", 0.5, "legal"),
    ]
    equal = mixture_parts("a/corpus.txt,b/corpus.txt", "MLM_DATASET")
    assert [(p.weight, p.key) for p in equal or ()] == [(0.5, "corpus"), (0.5, "corpus_2")]
    # a query's "=" is not a weight: two URLs with queries are two sources of equal weight
    queried = mixture_parts("https://host/a.jsonl?v=x/y,https://host/b.jsonl?v=x/z", "MLM_DATASET")
    assert [p.name for p in queried or ()] == ["https://host/a.jsonl?v=x/y", "https://host/b.jsonl?v=x/z"]


@pytest.mark.parametrize("value", ["demo", "corpus.jsonl", "https://host/data.jsonl?version=latest", "{not json"])
def test_one_source_is_not_a_mixture(value: str) -> None:
    assert mixture_parts(value, "MLM_DATASET") is None
    assert dataset_names(value, "MLM_DATASET") == [value]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("a.txt=0.7", "one source with a weight; a mixture names two or more"),
        ("a.txt=0.7,b.txt", "some sources have a weight and some not"),
        ("a.txt=0.7,b.txt=abc", "the weight of 'b.txt' is 'abc'; expected a number above 0"),
        ("a.txt=abc,b.txt=abc", "the weight of 'a.txt' is 'abc'; expected a number above 0"),
        ("a.txt=0,7,b.txt=0,3", "some sources have a weight and some not"),
        ("a.txt=0,b.txt=1", "the weight of 'a.txt' is '0'; expected a number above 0"),
        ("a.txt=nan,b.txt=1", "expected a number above 0"),
        ("a.txt=1,a.txt=2", "'a.txt' is named twice"),
        ("a.txt,,b.txt", "an empty source between commas"),
        ('{"a.txt": -1, "b.txt": 1}', "the weight of 'a.txt' is -1"),
        ('{"a.txt": 1}', "a mixture names two or more sources"),
    ],
)
def test_a_bad_mixture_is_one_line_naming_the_option(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match="^MLM_DATASET") as info:
        mixture_parts(value, "MLM_DATASET")
    assert says in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == 2
