"""The scores of a fine-tuned classifier (``./entrypoint.sh finetune``), as pure functions of its predictions.

Written with numpy rather than scikit-learn, which the image does not install (the tests compare them with
scikit-learn's, a development dependency): accuracy and macro F1 for every task, Matthews correlation for a binary
one (GLUE's CoLA metric; unlike accuracy it is 0 for a model that always answers the majority class); and the
lines that say them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

METRICS = ("accuracy", "macro_f1", "mcc", "f1")
SHOWN = {"accuracy": "accuracy", "macro_f1": "macro F1", "mcc": "MCC", "f1": "F1"}


def classification_scores(
    predicted: np.ndarray, true: np.ndarray, num_labels: int, positive: int | None = None
) -> dict[str, float]:
    """Accuracy and macro F1 (over the classes that occur in ``true`` or ``predicted``, as scikit-learn's
    ``f1_score(average="macro")``); MCC where ``num_labels`` is 2; F1 of class ``positive`` where one is given
    (GLUE's MRPC and QQP score, scikit-learn's ``f1_score(pos_label=positive)``)."""
    predicted, true = np.asarray(predicted).ravel(), np.asarray(true).ravel()
    scores = {"accuracy": float((predicted == true).mean()), "macro_f1": macro_f1(predicted, true)}
    if num_labels == 2:
        scores["mcc"] = matthews(predicted, true)
    if positive is not None:
        scores["f1"] = class_f1(predicted, true, positive)
    return scores


def class_f1(predicted: np.ndarray, true: np.ndarray, label: int) -> float:
    """F1 of one class (0 where it is never predicted correctly)."""
    tp = int(np.sum((predicted == label) & (true == label)))
    fp = int(np.sum((predicted == label) & (true != label)))
    fn = int(np.sum((predicted != label) & (true == label)))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def macro_f1(predicted: np.ndarray, true: np.ndarray) -> float:
    """The unweighted mean of each class's F1; a class never predicted nor true is not a class of this test."""
    return float(np.mean([class_f1(predicted, true, label) for label in np.union1d(predicted, true)]))


def matthews(predicted: np.ndarray, true: np.ndarray) -> float:
    """Matthews correlation of binary labels 0/1; 0 where a row or column of the confusion matrix is empty
    (scikit-learn's convention: a constant prediction carries no information)."""
    tp = float(np.sum((predicted == 1) & (true == 1)))
    tn = float(np.sum((predicted == 0) & (true == 0)))
    fp = float(np.sum((predicted == 1) & (true == 0)))
    fn = float(np.sum((predicted == 0) & (true == 1)))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def summary(runs: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    """Each metric's mean over the seeds and its sample standard deviation (None for one seed: there is no spread
    to measure)."""
    names = [name for name in METRICS if all(name in run for run in runs)]
    values = {name: np.array([run[name] for run in runs], dtype=float) for name in names}
    return {
        "mean": {name: float(v.mean()) for name, v in values.items()},
        "std": {name: float(v.std(ddof=1)) if len(v) > 1 else None for name, v in values.items()},
    }


def scores_text(scores: Mapping[str, float]) -> str:
    """``accuracy 0.9100, macro F1 0.9098, MCC 0.8203``."""
    return ", ".join(f"{SHOWN[name]} {scores[name]:.4f}" for name in METRICS if name in scores)


def summary_text(summarised: Mapping[str, Mapping[str, float | None]]) -> str:
    """``accuracy 0.910 ± 0.004, macro F1 ...`` (no ± for one seed)."""
    parts = []
    for name, mean in summarised["mean"].items():
        std = summarised["std"][name]
        parts.append(f"{SHOWN[name]} {mean:.4f}" + (f" ± {std:.4f}" if std is not None else ""))
    return ", ".join(parts)


def results_text(results: dict[str, Any]) -> str:
    """The score's line: the model, the task's size, and the mean and spread over the seeds (of each model of a
    run, in order), then the model the run started from ("before pretraining") and the random-init baseline."""
    runs = len(results["recipe"]["seeds"])
    text = (
        f"finetune {results['model']} on {results['task']} ({results['train_examples']:,} train, "
        f"{results['test_examples']:,} test, {len(results['labels'])} labels), {runs} seed(s): "
    )
    if "series" in results:
        text += "; ".join(f"{p['model']} (step {p['step']}): {summary_text(p)}" for p in results["series"])
    else:
        text += summary_text(results["pretrained"])
    if "starting" in results:
        text += f"; before pretraining ({results['starting']['model']}): {summary_text(results['starting'])}"
    if "baseline" in results:
        text += f"; random-init baseline: {summary_text(results['baseline'])}"
    return text
