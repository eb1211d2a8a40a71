"""What leaves the machine after a run: final/ pushed to the hub with a model card (hub, card and its template
card.md), and, for the trackers the Trainer reported to (``report_to``), the run's options, facts and final
metrics, plus the final model as an MLflow artifact (trackers).

:func:`publish_run` runs on world rank 0 only, once final/, ``all_results.json`` and ``run.json`` are written, so
every fact it reports is one the output directory already holds. A push or artifact that fails is an
:class:`~train.common.errors.EnvironmentProblem` (exit 3) naming what failed and how to send the model by hand:
final/ stays as it is. Secrets never pass through here: the hub token is read by huggingface_hub from ``HF_TOKEN``
/ ``HF_TOKEN_PATH`` (the config moves the option there: move_hub_token_to_env), the trackers' from their own
variables (``MLFLOW_TRACKING_TOKEN``, ``WANDB_API_KEY``, ...).
"""

from __future__ import annotations

from train.common.errors import EnvironmentProblem
from train.config import Config
from train.outputs.marker import weights_digest
from train.outputs.runfiles import RunFiles
from train.publish.card import CARD, CardTarget, mask_token, model_card, write_card
from train.publish.common import read_json
from train.publish.hub import push_final
from train.publish.trackers import final_metrics, log_to_mlflow, log_to_wandb, tracker_params

__all__ = ["CARD", "CardTarget", "final_metrics", "model_card", "publish_run", "push_final", "tracker_params"]


def publish_run(config: Config, files: RunFiles, step: int) -> None:
    """Write final/'s model card, push final/ (MLM_PUSH_TO_HUB) and complete the tracker runs; call on world rank 0
    after run.json is written. It takes the whole Config because it assembles what leaves the machine: the card and
    the trackers' parameters read every resolved option.

    Each destination is tried even when another failed; the failures are then raised together as one line."""
    final = files.final
    resolved = config.as_dict(redact=True)
    run = read_json(files.run_json)
    results = read_json(files.all_results)
    trackers = set(config.training.report_to or ())
    problems: list[str] = []
    if config.push_to_hub:  # the push writes the card into final/, naming the repository
        try:
            push_final(config, final, run, results, step)
        except EnvironmentProblem as exc:
            problems.append(str(exc))
    else:  # every final/ carries its card, pushed or not
        target = CardTarget(None, mask_token(final), weights_digest(final))
        card = model_card(resolved, config.sources, run, results, step, target)
        try:
            write_card(final, card)
        except OSError as exc:
            problems.append(f"writing the model card {final / CARD} failed ({exc.strerror or exc}); final/ is whole")
    if "mlflow" in trackers:
        try:
            log_to_mlflow(final, tracker_params(resolved, run, results), final_metrics(results), step)
        except EnvironmentProblem as exc:
            problems.append(str(exc))
    if "wandb" in trackers:
        log_to_wandb(tracker_params(resolved, run, results), final_metrics(results))
    if problems:
        raise EnvironmentProblem("; ".join(problems))
