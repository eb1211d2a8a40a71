"""``python -m bench.mfu OUTPUT_DIR``: what a finished run's training records say of its MFU, data wait and packing
(train/run/diagnostics.py), against a pass criterion; bench/gpu.sh's ``mfu`` case runs BERT-base on a GPU for it.

The criterion, for BERT-base built from its config, 128-token packed blocks, 256 a step, bf16 + tf32, the loader's
workers as the launcher picks them: the median record's MFU at least ``MFU_PASS`` of the GPU's dense bf16 peak
(train/machine/peaks.py; an H100 or H200 at 989.4 TFLOP/s), and the steps waiting for data at most ``WAIT_PASS`` of
the time. The first record (the loader's start, the first kernels) is left out. Exit 0 when it passes, 1 when not.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

MFU_PASS = 0.25
WAIT_PASS = 0.05
FIGURES = ("mfu", "data_wait_share", "packing_efficiency", "tokens_per_second_per_rank")


def medians(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each figure's median over the training records after the first (None where no record carries it)."""
    steps = [r for r in records if r.get("event") == "train"][1:]
    out: dict[str, float | None] = {}
    for name in FIGURES:
        values = [r[name] for r in steps if isinstance(r.get(name), (int, float))]
        out[name] = statistics.median(values) if values else None
    return out


def verdict(figures: dict[str, float | None]) -> tuple[bool, str]:
    """Whether ``figures`` pass, and the line that says so."""
    mfu, wait = figures["mfu"], figures["data_wait_share"]
    if mfu is None or wait is None:
        return False, "FAIL: the records carry no MFU or data wait (a GPU not in the peak table?)"
    passed = mfu >= MFU_PASS and wait <= WAIT_PASS
    return passed, (
        f"{'PASS' if passed else 'FAIL'}: median MFU {mfu:.1%} (at least {MFU_PASS:.0%}), data wait {wait:.1%} "
        f"(at most {WAIT_PASS:.0%}), packing efficiency {figures['packing_efficiency']}, "
        f"{figures['tokens_per_second_per_rank']} tokens/s a rank"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.mfu OUTPUT_DIR", file=sys.stderr)
        return 2
    log = Path(argv[0]) / "logs" / "train.jsonl"
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    passed, line = verdict(medians(records))
    print(line)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
