"""Where a training step of the modern recipe goes: the encoder, the masked-only head, the optimizer (issue 49's
"the masked-only head at 30 % masking": the modern recipe's steps cost about 1.5x the classic recipe's).

``python -m bench.step_parts [--sizes tiny,mid] [--steps 12]``: the quality series' models (DistilBERT from
scratch, tiny 2 x 128 and mid 6 x 384, the real 30,522-token vocabulary) in one process, on random token ids in
packed 128-token blocks of 16 (the quality series' batch), at 15 % and 30 % masking with the masked-only head
(train/model/head.py) and at 30 % with the dense head. Per step, the median over the steps after the first few:

- ``step``: forward, backward and AdamW's step, as the Trainer runs them (no data loading, no logging);
- ``encoder``: the encoder alone, forward and backward (its output's mean as the loss), on the same batch;
- ``head``: the step's forward and backward less the encoder's (the vocabulary projection at the masked
  positions, its cross-entropy, and their gradients);
- ``optimizer``: AdamW's step and zeroing the gradients (over every parameter: the 30,522 x dim embeddings, tied to
  the projection, are most of a small model's).

Not a whole run from ./entrypoint.sh: it splits a step, which a whole run cannot; the figures are the ones to
compare with each other, on one machine. Writes bench/results/<date>-<host>-step-parts.md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import DistilBertConfig, DistilBertForMaskedLM

from train.model.head import use_masked_only_head

SIZES = {
    "tiny": {"n_layers": 2, "dim": 128, "hidden_dim": 512, "n_heads": 2},
    "mid": {"n_layers": 6, "dim": 384, "hidden_dim": 1536, "n_heads": 6},
}
VOCAB, BLOCK, BATCH, WARM = 30522, 128, 16, 3
VARIANTS = (("masked-only", 0.15), ("masked-only", 0.30), ("dense", 0.30))
RESULTS = Path(__file__).resolve().parent / "results"


def batch_of(rate: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(1000, VOCAB, (BATCH, BLOCK), generator=generator)
    masked = torch.rand((BATCH, BLOCK), generator=generator) < rate
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def model_of(size: str, head: str) -> Any:
    torch.manual_seed(0)
    model = DistilBertForMaskedLM(DistilBertConfig(vocab_size=VOCAB, **SIZES[size]))
    if head == "masked-only":
        use_masked_only_head(model, probe=False)
    return model.train()


def measure(size: str, head: str, rate: float, steps: int) -> dict[str, float]:
    """The medians of one variant's parts, in seconds."""
    model = model_of(size, head)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    generator = torch.Generator().manual_seed(1)
    parts: dict[str, list[float]] = {"step": [], "encoder": [], "optimizer": []}
    for index in range(WARM + steps):
        batch = batch_of(rate, generator)
        started = time.perf_counter()
        model(**batch).loss.backward()
        backward_done = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stepped = time.perf_counter()
        hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
        hidden.float().mean().backward()
        encoder = time.perf_counter() - stepped
        optimizer.zero_grad(set_to_none=True)
        if index >= WARM:
            parts["step"].append(stepped - started)
            parts["encoder"].append(encoder)
            parts["optimizer"].append(stepped - backward_done)
    medians = {name: statistics.median(values) for name, values in parts.items()}
    medians["head"] = max(medians["step"] - medians["optimizer"] - medians["encoder"], 0.0)
    return medians


def table(results: dict[tuple[str, str, float], dict[str, float]]) -> list[str]:
    lines = [
        "| size | head | masking | step (ms) | encoder fwd+bwd | head fwd+bwd | optimizer | step vs 15 % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (size, head, rate), parts in results.items():
        base = results[(size, "masked-only", 0.15)]["step"]
        share = {name: f"{1000 * parts[name]:.1f} ({parts[name] / parts['step']:.0%})" for name in parts}
        lines.append(
            f"| {size} | {head} | {rate:.0%} | {1000 * parts['step']:.1f} | {share['encoder']} | {share['head']} | "
            f"{share['optimizer']} | {parts['step'] / base:.2f}x |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,mid")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    results = {}
    for size in args.sizes.split(","):
        for head, rate in VARIANTS:
            results[(size, head, rate)] = measure(size, head, rate, args.steps)
            print(
                f"{size} {head} {rate:.0%}: "
                + ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in results[(size, head, rate)].items()),
                flush=True,
            )
    lines = [
        f"# Where a step goes ({datetime.date.today()}, {platform.node()}, {torch.get_num_threads()} threads)",
        "",
        f"`python -m bench.step_parts --sizes {args.sizes} --steps {args.steps}`: DistilBERT from scratch, "
        f"{BATCH} x {BLOCK} tokens a step, medians of {args.steps} steps after {WARM}; bench/step_parts.py says how.",
        "",
        *table(results),
    ]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{datetime.date.today()}-{platform.node().split('.')[0] or 'host'}-step-parts.md"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
