"""What MLM_SHARDING=fsdp refuses, each as one line naming the option, before any data is read."""

from __future__ import annotations

import pytest

from tests.helpers import demo_config
from train.common.errors import ConfigError
from train.run.sharding import check_sharding


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            {"load_best_model_at_end": "true", "eval_strategy": "steps", "save_strategy": "steps"},
            "load_best_model_at_end",
        ),
        ({"save_strategy": "no", "fsdp": "full_shard"}, "leave the Trainer's fsdp"),
        ({"save_strategy": "no", "fp16": "true"}, "fp16 is not supported under fsdp"),
    ],
)
def test_fsdp_refuses(options: dict[str, str], said: str) -> None:
    config = demo_config(sharding="fsdp", **options)
    with pytest.raises(ConfigError, match=said) as refused:
        check_sharding(config)
    assert str(refused.value).startswith("MLM_SHARDING=fsdp: ") and "\n" not in str(refused.value)


def test_the_trainers_fsdp_under_ddp_is_refused_naming_the_option() -> None:
    config = demo_config(fsdp="full_shard auto_wrap", save_strategy="no")
    with pytest.raises(ConfigError, match="the Trainer's own FSDP is not used by this job; set MLM_SHARDING=fsdp"):
        check_sharding(config)


def test_ddp_is_the_default_and_checks_nothing() -> None:
    config = demo_config()
    assert config.job.sharding == "ddp"
    check_sharding(config)
