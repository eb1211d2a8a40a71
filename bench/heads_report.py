"""The heads series' report (bench/heads_series.py): the masked-only head against the same model's dense head,
per architecture, as Markdown and as one line per run."""

from __future__ import annotations

import json
from typing import Any

from bench.report import FLOPS_NOTE, MIB, _range, _ratio, machine

HEADS_NOTES = (
    "Step time: seconds per optimizer step over the steps after the first fifth (bench/stats.py's window), from the "
    "run's own record of its step ends. The ratio is dense / masked-only step time within each pair (above 1: the "
    "masked-only head is faster); a target is met in a pair whose ratio reaches it. Both heads train the same model "
    "on the same packed 128-token blocks with the same flags but --masked_only_head; the vocabulary is the "
    "tokenizer's for every architecture (no vocab_size override)."
)


def heads_run_line(run: dict[str, Any]) -> str:
    mfu = f", MFU {run['mfu']:.1%}" if run.get("mfu") is not None else ""
    return (
        f"heads {run['architecture']} pair {run['rep']} {run['recipe']}: {run['step_s']:.3f} s/step, "
        f"{run['real_tokens_per_s']:,.0f} real tokens/s, first step {run['first_step_s']:.1f} s, "
        f"wall {run['wall_s']:.1f} s, peak {run['peak_memory_bytes'] / MIB:,.0f} MiB{mfu}, "
        f"final loss {run['final_loss']:.3f}"
    )


def heads_markdown(result: dict[str, Any]) -> str:
    """The heads series' report: per architecture, each head's step time and the ratio per pair; each run."""
    env, settings, corpus, runs = result["environment"], result["settings"], result["corpus"], result["runs"]
    gpu = settings["device"] == "cuda"
    out = [f"# Benchmark: the masked-only head against the dense head ({result['date'][:10]}, {env['host']})\n"]
    add = out.append
    vocabs = sorted({s["vocab_size"] for s in result["summary"].values()})
    add(
        f"{machine(result)}; torch {env['torch']}, transformers {env['transformers']}. Data: the real series' "
        f"{corpus['bytes'] / MIB:.1f} MiB of real English ({corpus['source']}) and its WordPiece tokenizer "
        f"(vocabulary {', '.join(f'{v:,}' for v in vocabs) or '?'}), packed into 128-token blocks. Each architecture "
        f"from scratch at the {settings['size']} size, {settings['max_steps']} optimizer steps of "
        f"{settings['batch_size']} blocks per run; {settings['pairs']} pair(s), dense then masked-only, each run a "
        "fresh torchrun process.\n"
    )
    add("## Seconds per step: dense against masked-only, min – max over the pairs\n")
    add("| architecture | parameters | dense s/step | masked-only s/step | dense / masked-only | per pair | target |"
        + (" MFU dense | MFU masked-only |" if gpu else ""))  # fmt: skip
    add("|---|---|---|---|---|---|---|" + ("---|---|" if gpu else ""))
    for name, s in result["summary"].items():
        cells = [f"{s['parameters'] / 1e6:.1f} M"]
        cells += [_range(s["heads"][h]["step_s"], ".3f") if h in s["heads"] else "–" for h in ("dense", "masked-only")]
        ratio = s["ratio"]
        cells.append(f"**{_ratio(ratio)}**" if ratio else "–")
        cells.append(", ".join(f"{v:.2f}" for v in ratio["values"]) if ratio else "–")
        if s["target"] is None:
            cells.append("–")
        else:
            met = s["pairs_meeting_target"]
            cells.append(f"≥ {s['target']:.1f}: met in {met} of {len(ratio['values']) if ratio else 0} pair(s)")
        if gpu:
            for head in ("dense", "masked-only"):
                mfu = (s["heads"].get(head) or {}).get("mfu")
                cells.append(_range(mfu, ".1%") if mfu else "–")
        add(f"| {name} | " + " | ".join(cells) + " |")
    add("")
    for failure in result.get("failures") or []:
        first = failure["error"].splitlines()[0]
        add(f"- **{failure['architecture']}** failed (pair {failure['pair']}, {failure['head']}): {first}")
    if result.get("failures"):
        add("")

    add("## Every run, in the order they ran\n")
    add("| run | s/step | real tokens/s | wall s | first step s | peak MiB | final loss | load avg (before, after) |"
        + (" MFU |" if gpu else ""))  # fmt: skip
    add("|---|---|---|---|---|---|---|---|" + ("---|" if gpu else ""))
    for run in runs:
        load = ", ".join(f"{x:.1f}" for x in run["load_avg_1m"])
        row = (
            f"| {run['label']} | {run['step_s']:.3f} | {run['real_tokens_per_s']:,.0f} | {run['wall_s']:.1f} | "
            f"{run['first_step_s']:.1f} | {run['peak_memory_bytes'] / MIB:,.0f} | {run['final_loss']:.3f} | {load} |"
        )
        add(row + ((f" {run['mfu']:.1%} |" if run.get("mfu") is not None else " – |") if gpu else ""))
    add("")

    add("## Architectures\n")
    for name, arch in result["architectures"].items():
        model = f"{name}.json" if arch["config_json"] else arch["model"]  # written in the workdir
        extra = f"; {name}.json: `{json.dumps(arch['config_json'])}`" if arch["config_json"] else ""
        add(f"- **{name}** (`{model}`): {arch['what']}; overrides `{arch['config_overrides']}`{extra}")
    add("\nFlags of each head's runs (`<model>`, `<overrides>`: the architecture's, above):\n")
    for head, flags in result["flags"].items():
        add(f"- **{head}**: `{' '.join(flags)}`")
    add(f"\n{HEADS_NOTES}")
    if gpu:
        add(f"\n{FLOPS_NOTE}")
    return "\n".join(out) + "\n"
