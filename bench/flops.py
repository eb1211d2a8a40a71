"""Model FLOPs per token, device peaks, and MFU (model FLOPs utilisation).

FLOPs per trained token (forward + backward), the usual estimate (Kaplan et al. 2020; PaLM, Chowdhery et al.
2022, appendix B) for an encoder that attends over ``T`` tokens::

    flops_per_token = 6 * N  +  12 * L * d * T

- ``6 * N``: each parameter does one multiply-add (2 FLOPs) per token forward and two backward (gradients of the
  input and of the weight). ``N`` is every parameter of the masked-LM model. DistilBERT/BERT tie the vocabulary
  projection to the token embeddings, so that matrix is counted once, which is right: the embedding lookup costs
  no FLOPs and the projection costs ``2 * d * V`` forward. Position embeddings, LayerNorms and biases are counted
  too although they do (almost) no matrix work; they are under 1 % of DistilBERT.
- ``12 * L * d * T``: attention scores ``Q K^T`` and the weighted sum ``A V`` are each ``2 * T * d`` FLOPs per token
  per layer forward, times 3 for forward + backward. An encoder attends over the whole sequence (no causal half).
  ``T`` is the sequence length the token attends over: the block length when packed, the sample's real length
  otherwise (padding is not model work).
- The masked-only head computes the head (the ``d x d`` transform and the ``d x V`` projection) at the masked
  fraction ``p`` of positions only, so ``6 * (d*d + d*V) * (1 - p)`` is taken off: MFU counts the work the model
  needs, not work skipped.

The rule reads only the parameter count, layers, hidden size and vocabulary (bench/probe.py takes them from the
model and its config, DistilBERT's names or BERT's), so it holds as it is for the heads series' models
(bench/heads.py) where every layer has its own weights and the head is a ``d x d`` transform and a tied ``d x V``
projection: BERT, RoBERTa, XLM-RoBERTa, ESM, ELECTRA's generator with embeddings as wide as the encoder, and
ModernBERT (its GLU feed-forward is in ``N``; its sliding-window layers attend over fewer than ``T`` tokens,
which at 128 tokens is under 1 % of its FLOPs). DeBERTa's relative-position terms add attention work it does not
count. It does not hold for ALBERT: one layer's weights run ``L`` times, so ``6 N`` undercounts it, and its head
projects from a narrower embedding; the heads series gives no MFU for it.

MFU = flops_per_token x real tokens per second / (peak FLOP/s of the devices used). Peaks are the vendors' dense
bf16/fp16 tensor-core figures (no sparsity), per GPU: the job's table (train/machine/peaks.py). The job's own
records count MFU from each batch's real tokens, spans and masked positions (train/run/diagnostics.py); this
estimate from rates and averages stays for the bench's summaries of runs from before those records.
"""

from __future__ import annotations

from train.machine.peaks import gpu_peak


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name, or None when it is not in the table: the job's own table
    (train/machine/peaks.py, what the training records' MFU is a share of), so the bench and the job agree."""
    peak = gpu_peak(device_name, "bf16")
    return None if peak is None else peak.flops


def flops_per_token(
    parameters: int,
    layers: int,
    hidden: int,
    seq_len: float,
    vocab_size: int = 0,
    head_fraction: float = 1.0,
) -> float:
    """Training FLOPs per token: ``6 N + 12 L d T``, less the head work a masked-only head skips.

    ``head_fraction`` is the fraction of positions the vocabulary head runs at: 1 for the dense head, the masking
    probability for the masked-only head (``vocab_size`` is then needed).
    """
    if not 0.0 <= head_fraction <= 1.0:
        raise ValueError(f"head_fraction={head_fraction}: expected a fraction from 0 to 1")
    dense = 6.0 * parameters + 12.0 * layers * hidden * seq_len
    skipped_head = 6.0 * (hidden * hidden + hidden * vocab_size) * (1.0 - head_fraction)
    return dense - skipped_head


def mfu(flops_token: float, tokens_per_second: float, peak: float, devices: int = 1) -> float:
    """Model FLOPs utilisation, a fraction: achieved model FLOP/s over the devices' peak."""
    if peak <= 0 or devices < 1:
        raise ValueError("peak and devices must be positive")
    return flops_token * tokens_per_second / (peak * devices)
