"""The average of several models' weights (checkpoint averaging: NeoBERT merges checkpoints, and an average of the
decay branches of one stable run is how a team combines them), tensor by tensor, refused where the models differ.

Nothing in transformers or torch averages saved models; ``torch.optim.swa_utils`` averages a live model's
parameters during training, not files of finished ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def mismatch(names: Sequence[str], states: Sequence[Mapping[str, torch.Tensor]]) -> str | None:
    """Why these state dicts cannot be averaged (other tensors, shapes or dtypes than the first's), or None."""
    first = states[0]
    for name, state in zip(names[1:], states[1:], strict=True):
        missing, extra = sorted(first.keys() - state.keys()), sorted(state.keys() - first.keys())
        if missing or extra:
            what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which {names[0]} lacks"
            return f"{name} {what}: not the same architecture as {names[0]}"
        for key, tensor in first.items():
            other = state[key]
            if other.shape != tensor.shape:
                return f"{name}: {key} is {tuple(other.shape)}, {tuple(tensor.shape)} in {names[0]}"
            if other.dtype != tensor.dtype:
                return f"{name}: {key} is {other.dtype}, {tensor.dtype} in {names[0]}"
    return None


def normalised(weights: Sequence[float] | None, count: int) -> list[float]:
    """The weights of ``count`` models, summing to one (None: uniform); ValueError for a wrong count or sign."""
    if weights is None:
        return [1.0 / count] * count
    if len(weights) != count or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"expected {count} weights of 0 or more, not all 0; got {list(weights)}")
    total = sum(weights)
    return [w / total for w in weights]


def average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """Each floating tensor the weighted mean (summed in float64, then in the first model's dtype); a tensor of
    integers or booleans (a buffer such as position ids) must be equal in every model and is kept as it is."""
    averaged: dict[str, torch.Tensor] = {}
    for key, tensor in states[0].items():
        if tensor.is_floating_point():
            total = sum(w * state[key].to(torch.float64) for w, state in zip(weights, states, strict=True))
            averaged[key] = torch.as_tensor(total).to(tensor.dtype).contiguous()
        else:
            differing = [i for i, state in enumerate(states) if not torch.equal(state[key], tensor)]
            if differing:
                raise ValueError(
                    f"{key}: a tensor of {tensor.dtype} differs between the models (model {differing[0] + 1})"
                )
            averaged[key] = tensor.clone()
    return averaged
