"""Whether a hub push could work, decided before any training (the push itself: test_publish.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from train.common.errors import EXIT_CONFIG, ConfigError
from train.common.hub_auth import check_push, has_token, token_file, valid_repo_id


def test_the_token_file_is_hf_token_path_else_in_hf_home(tmp_path: Path) -> None:
    assert token_file({"HF_HOME": str(tmp_path)}) == tmp_path / "token"
    assert token_file({"HF_HOME": str(tmp_path), "HF_TOKEN_PATH": str(tmp_path / "t")}) == tmp_path / "t"
    assert token_file({"HF_TOKEN_PATH": "~/t", "HOME": str(tmp_path)}) == Path("~/t").expanduser()


@pytest.mark.parametrize(
    ("given", "env", "found"),
    [
        ("hf_option", {}, True),
        (None, {"HF_TOKEN": "hf_x"}, True),
        (None, {"HUGGING_FACE_HUB_TOKEN": "hf_x"}, True),  # huggingface_hub's older name
        (None, {"HF_OIDC_RESOURCE": "https://hub"}, True),
        (None, {"HF_TOKEN": ""}, False),
        (None, {}, False),
    ],
)
def test_a_token_is_looked_for_where_huggingface_hub_looks(
    tmp_path: Path, given: str | None, env: dict, found: bool
) -> None:
    assert has_token(given, {"HF_HOME": str(tmp_path), **env}) is found


def test_a_token_file_counts(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("hf_x")
    assert has_token(None, {"HF_HOME": str(tmp_path)})


@pytest.mark.parametrize(("repo_id", "valid"), [("mlm", True), ("team/mlm-1.0_a", True), ("a/b/c", False),
                                                ("bad name", False), ("x" * 97, False)])  # fmt: skip
def test_repository_ids_are_checked_by_the_hubs_rule(repo_id: str, valid: bool) -> None:
    assert valid_repo_id(repo_id) is valid


@pytest.mark.parametrize(
    ("repo_id", "env", "message"),
    [
        (None, {}, r"^MLM_PUSH_TO_HUB=true: set MLM_HUB_MODEL_ID to the repository to push final/ to"),
        ("a/b/c", {}, r"^MLM_HUB_MODEL_ID='a/b/c': expected name or namespace/name"),
        ("team/mlm", {"HF_TOKEN": "hf_x", "HF_HUB_OFFLINE": "1"}, r"HF_HUB_OFFLINE is set: unset it .*turn MLM_PUSH"),
        ("team/mlm", {}, r"^MLM_PUSH_TO_HUB=true: no hub token; set HF_TOKEN .* token file, now .*/token\) to a tok"),
    ],
)
def test_a_push_that_could_not_work_is_exit_2(tmp_path: Path, repo_id: str | None, env: dict, message: str) -> None:
    environ = {"HF_HOME": str(tmp_path), **env}
    with pytest.raises(ConfigError, match=message) as info:
        check_push(repo_id, None, environ, source="MLM_PUSH_TO_HUB", repo=f"MLM_HUB_MODEL_ID={repo_id!r}")
    assert info.value.exit_code == EXIT_CONFIG


def test_a_push_that_could_work_passes(tmp_path: Path) -> None:
    check_push("team/mlm", "hf_option", {"HF_HOME": str(tmp_path)}, source="--push_to_hub", repo="x")
