"""The hub push of final/: the repository created if needed, the model card written into final/, final/ uploaded
as one commit. HF_ENDPOINT and the token are huggingface_hub's (the config moved the option to ``HF_TOKEN``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from train.common.console import say
from train.common.errors import EnvironmentProblem
from train.config import Config
from train.outputs.marker import weights_digest
from train.publish.card import CardTarget, mask_token, model_card, write_card
from train.publish.common import why_failed


def push_final(config: Config, final: Path, run: dict[str, Any], results: dict[str, Any], step: int) -> str:
    """Create the repository if needed (``hub_private_repo`` applies to a new one), write the model card into
    final/ and upload final/ as one commit; the repository's URL. A failure is an EnvironmentProblem saying how to
    push by hand: final/ is kept as it is. It takes the whole Config because it assembles the push: the Trainer's
    hub options, and the card of every resolved option."""
    from huggingface_hub import HfApi  # costly: loaded only when pushing

    training = config.training
    repo_id = str(training.hub_model_id)
    api = HfApi()
    try:
        repo = api.create_repo(repo_id, private=training.hub_private_repo, exist_ok=True)
        repo_id = repo.repo_id
        write_card(
            final,
            model_card(
                config.as_dict(redact=True),
                config.sources,
                run,
                results,
                step,
                CardTarget(repo_id, mask_token(final), weights_digest(final)),
            ),
        )
        api.upload_folder(
            repo_id=repo_id,
            folder_path=final,
            commit_message=commit_summary(results, step),
            commit_description=f"Image revision {run.get('image_revision') or 'unknown'}; "
            f"dataset fingerprint {run.get('dataset_fingerprint')}.",
        )
    except Exception as exc:  # noqa: BLE001 - whatever failed (HTTP, network, the card's metadata), final/ is kept
        raise push_failed(training, config.sources, final, repo_id, api.endpoint, exc) from exc
    say(f"pushed final/ to {repo}")
    return str(repo)


def commit_summary(results: dict[str, Any], step: int) -> str:
    """The commit's title: the steps and, when measured, the final evaluation loss."""
    loss = results.get("eval_loss")
    return f"mlm-trainer: final model after {step:,} steps" + (
        f", eval loss {loss:.4f}" if isinstance(loss, float) else ""
    )


def push_failed(
    training: TrainingArguments, sources: Mapping[str, str], final: Path, repo_id: str, endpoint: str, exc: Exception
) -> EnvironmentProblem:
    """One line: what failed and why, what to check (by the HTTP status), and the command that pushes by hand;
    ``sources`` name the hub options as the user set them."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    repo_label, push_label = (sources.get(name, name) for name in ("hub_model_id", "push_to_hub"))
    if status in (401, 403):
        fix = f"check that the token (HF_TOKEN, HF_TOKEN_FILE or HF_TOKEN_PATH) may write to {repo_id}"
    elif status == 404:
        fix = f"check {repo_label} ({repo_id}) and that the token may create repositories there"
    else:
        fix = "the hub or the network failed (HF_ENDPOINT names the hub); try again later"
    private = " --private" if training.hub_private_repo else ""
    return EnvironmentProblem(
        f"{push_label}=true: pushing final/ to {repo_id} at {endpoint} failed "
        f"({why_failed(exc)}); the model is kept in {final}: {fix}, then push it with: "
        f"hf upload {repo_id} {final}{private}"
    )
