"""The benchmark's Markdown report and progress lines: pure formatting of the result dictionaries of the series
(bench/demo_series.py, bench/real_series.py)."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from bench.startup import IMPORTS as STARTUP_IMPORTS

MIB = 1024 * 1024
STAGES = ("process", "imports", "setup", "first_step")

FLOPS_NOTE = (
    "MFU = model FLOPs per token x real tokens/s / the GPU's dense bf16 peak (H100/H200 SXM 989.4, H100 PCIe 756, "
    "H100/H200 NVL 835, A100 312 TFLOP/s). FLOPs per token = 6 x parameters + 12 x layers x hidden x T "
    "(T: the block length when packed, else the real tokens per sample), less 6 x (hidden^2 + hidden x vocab) x "
    "(1 - masking probability) with the masked-only head; see bench/flops.py."
)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_line(rep: int, run: dict[str, Any]) -> str:
    mfu = f", MFU {run['mfu']:.1%}" if run.get("mfu") is not None else ""
    return (
        f"run {rep or 'extra'} {run['recipe']}: {run['real_tokens_per_s']:,.0f} real tokens/s, "
        f"{run['samples_per_s']:,.1f} samples/s, first step {run['first_step_s']:.1f} s, wall {run['wall_s']:.1f} s, "
        f"peak {run['peak_memory_bytes'] / MIB:,.0f} MiB{mfu}, final loss {run['final_loss']:.3f}"
    )


def _spread(s: dict[str, float], fmt: str) -> str:
    return f"{s['median']:{fmt}} [{s['min']:{fmt}} – {s['max']:{fmt}}]"


def markdown(result: dict[str, Any]) -> str:
    """The demo series' report, section by section."""
    gpu = result["settings"]["device"] == "cuda"
    out = _demo_introduction(result)
    out += _demo_ratios(result.get("ratios", {}))
    out += _demo_each_recipe(result["summary"], gpu)
    out += _demo_every_run(result["runs"], gpu)
    out += _demo_time_to_first_step(result["runs"])
    out += _demo_loss_curves(result.get("loss_curves") or {})
    out += _demo_tokenizing(result["tokenization"])
    out += _demo_first_step(result)
    if result.get("startup"):
        out += startup_markdown(result["startup"])
    out += _demo_recipes(result, gpu)
    return "\n".join(out) + "\n"


def _demo_introduction(result: dict[str, Any]) -> list[str]:
    """The title, and a paragraph on the machine, the model, the data and the runs."""
    env, settings = result["environment"], result["settings"]
    extras = settings.get("extras") or []
    then = f"; then single runs ({', '.join(extras)}) with the flags listed below" if extras else ""
    return [
        f"# Benchmark: the seed recipe against our default recipe ({result['date'][:10]}, {env['host']})\n",
        f"{machine(result)}; torch {env['torch']}, transformers {env['transformers']}. Model: DistilBERT from scratch "
        f"(`{settings['model_overrides']}`), the same WordPiece tokenizer and the same 50,000 demo samples for "
        f"both recipes; {settings['max_steps']} optimizer steps of 32 samples per run; {settings['repeats']} "
        f"repetitions, alternating {' / '.join(settings['recipes'])}, each run a fresh torchrun process{then}. "
        "Throughput counts real (non-padding) tokens over the steps after the first fifth.\n",
    ]


def _demo_ratios(ratios: dict[str, Any]) -> list[str]:
    """Per recipe, a table of its ratios to the seed recipe."""
    out: list[str] = []
    for name, metrics in ratios.items():
        out.append(f"## {name} / seed, per repetition: median [min – max]\n")
        out.append("| metric | ratio | per repetition |")
        out.append("|---|---|---|")
        for metric, s in metrics.items():
            values = ", ".join(f"{v:.2f}" for v in s["values"])
            out.append(f"| {metric.replace('_', ' ')} | **{_spread(s, '.2f')}** | {values} |")
        out.append("")
    return out


def _demo_each_recipe(summary: dict[str, Any], gpu: bool) -> list[str]:
    """Each recipe's figures, median [min – max] over its runs."""
    out = ["## Each recipe: median [min – max]\n"]
    header = "| recipe | real tokens/s | samples/s | wall s | first step s | peak memory MiB |"
    out.append(header + (" MFU |" if gpu else ""))
    out.append("|---|---|---|---|---|---|" + ("---|" if gpu else ""))
    for name, s in summary.items():
        memory = {k: v / MIB for k, v in s["peak_memory_bytes"].items()}
        row = (
            f"| {name} | {_spread(s['real_tokens_per_s'], ',.0f')} | {_spread(s['samples_per_s'], ',.1f')} | "
            f"{_spread(s['wall_s'], '.1f')} | {_spread(s['first_step_s'], '.1f')} | {_spread(memory, ',.0f')} |"
        )
        if gpu:
            row += f" {_spread(s['mfu'], '.1%')} |" if "mfu" in s else " |"
        out.append(row)
    out.append("")
    return out


def _demo_every_run(runs: list[dict[str, Any]], gpu: bool) -> list[str]:
    """Every run's figures, in the order they ran."""
    out = ["## Every run, in the order they ran\n"]
    header = "| run | recipe | real tokens/s | samples/s | wall s | first step s | peak MiB | final loss | eval loss |"
    out.append(header + " load avg (before, after) |" + (" MFU |" if gpu else ""))
    out.append("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else ""))
    for run in runs:
        eval_loss = f"{run['eval_loss']:.3f}" if run.get("eval_loss") is not None else "–"
        load = ", ".join(f"{x:.1f}" for x in run["load_avg_1m"])
        row = (
            f"| {run['label']} | {run['recipe']} | {run['real_tokens_per_s']:,.0f} | {run['samples_per_s']:,.1f} | "
            f"{run['wall_s']:.1f} | {run['first_step_s']:.1f} | {run['peak_memory_bytes'] / MIB:,.0f} | "
            f"{run['final_loss']:.3f} | {eval_loss} | {load} |"
        )
        if gpu:
            row += f" {run['mfu']:.1%} |" if run.get("mfu") is not None else " – |"
        out.append(row)
    out.append("")
    return out


def _demo_time_to_first_step(runs: list[dict[str, Any]]) -> list[str]:
    """Per recipe, the median seconds of each start-up stage (runs that timed their stages only)."""
    startups = [r for r in runs if r.get("startup_s")]
    if not startups:
        return []
    out = ["## Where the time to the first step goes, median seconds\n"]
    out.append("| recipe | torchrun + Python start | imports | data, model, Trainer | first step (workers start) |")
    out.append("|---|---|---|---|---|")
    for name in dict.fromkeys(r["recipe"] for r in startups):
        parts = [statistics.median(r["startup_s"][k] for r in startups if r["recipe"] == name) for k in STAGES]
        out.append(f"| {name} | " + " | ".join(f"{p:.1f}" for p in parts) + " |")
    out.append("")
    return out


def _demo_loss_curves(curves: dict[str, Any]) -> list[str]:
    """The seed recipe's and ours' loss side by side, step by step."""
    if not curves.get("rows"):
        return []
    out = ["## Loss curves, repetition 1 (same model, data and steps)\n"]
    out.append("| step | seed | ours | difference |")
    out.append("|---|---|---|---|")
    for step, seed, ours in curves["rows"]:
        out.append(f"| {step} | {seed:.4f} | {ours:.4f} | {ours - seed:+.4f} |")
    out.append(
        f"\nLargest difference: {curves['max_abs_diff']:.4f} ({curves['max_rel_diff']:.2%} of the seed's loss).\n"
    )
    return out


def _demo_tokenizing(tokenization: dict[str, Any]) -> list[str]:
    """Per padding, tokenizing the demo samples twice: the second time from the cache."""
    out = ["## Tokenizing the 50,000 demo samples\n"]
    out.append("| padding | samples | first run s | second run s | second run from the cache |")
    out.append("|---|---|---|---|---|")
    for padding, t in tokenization.items():
        hit = "yes" if t["cache_hit"] else "**no**"
        out.append(f"| {padding} | {t['samples']:,} | {t['cold_s']:.2f} | {t['cached_s']:.2f} | {hit} |")
    out.append("")
    return out


def _demo_first_step(result: dict[str, Any]) -> list[str]:
    """A sentence on the time to configs/demo.yaml's first step, with empty caches and warm."""
    entry = result.get("first_step_demo")
    if not entry:
        return []
    warm = (result.get("startup") or {}).get("demo")
    warm_text = f"; warm, {_spread(warm['first_step_s'], '.1f')} s (the start-up runs below)" if warm else ""
    return [
        f"Time to the first optimizer step on configs/demo.yaml via {entry['via']}: "
        f"{entry['cold_cache_s']:.1f} s with empty caches (tokenizer training and tokenization included)"
        f"{warm_text}.\n"
    ]


def _demo_recipes(result: dict[str, Any], gpu: bool) -> list[str]:
    """Each recipe's flags, the flags of every run, the proposed defaults and, on a GPU, how MFU is counted."""
    out = ["## Recipes\n"]
    for name, flags in result["recipes"].items():
        out.append(f"- **{name}**: `{' '.join(flags) or '(the defaults)'}`")
    out.append(f"- every run: `{' '.join(result['common_flags'])}`")
    proposed = ", ".join(f"{k}={v}" for k, v in result["proposed_defaults"].items())
    out.append(f'\n"ours" is the default recipe plus the proposed default changes ({proposed}).')
    if gpu:
        out.append(f"\n{FLOPS_NOTE}")
    return out


# ------------------------------------------------------------------------------------------- real-corpus series

REAL_NOTES = (
    "Each recipe keeps its own defaults beyond the flags above: ours loads batches with 2 dataloader workers and "
    "pads to a multiple of 8, or to the longest with `--pad_to_multiple_of 1` in its flags above (what our launcher "
    "decides on a CPU); run_mlm.py's TrainingArguments load them in the training process (0 workers) and "
    "DataCollatorForLanguageModeling pads to the longest row (a multiple of 8 only with fp16). Both packed recipes "
    "train on full 128-token blocks (real tokens per sample 128), both dropping the remainder of each map batch "
    "of 1,000 lines. Losses differ a little between recipes: the "
    "masks are drawn differently (ours per sample from (seed, epoch, index), the stock collator from the global "
    "generator)."
)


def real_run_line(run: dict[str, Any]) -> str:
    return (
        f"real {run['model']} pair {run['rep']} {run['recipe']}: {run['real_tokens_per_s']:,.0f} real tokens/s, "
        f"{run['samples_per_s']:,.1f} samples/s, first step {run['first_step_s']:.1f} s, wall {run['wall_s']:.1f} s, "
        f"peak {run['peak_memory_bytes'] / MIB:,.0f} MiB, final loss {run['final_loss']:.3f}"
    )


def _ratio(s: dict[str, float]) -> str:
    return f"{s['median']:.2f}× [{s['min']:.2f} – {s['max']:.2f}]"


def machine(result: dict[str, Any]) -> str:
    """The GPU's name, or the CPU's cores and the torch threads each run had."""
    env, runs = result["environment"], result["runs"]
    if result["settings"]["device"] == "cuda":
        return env["gpu"]
    threads = runs[0]["probe"]["torch_threads"] if runs else "?"
    return f"CPU, {env['cpu_count']} cores, {threads} torch thread(s) per run"


def real_markdown(result: dict[str, Any]) -> str:
    """The real-corpus series' report: per model, the ratios per pair, the head's share, each recipe, each run."""
    env, settings, corpus = result["environment"], result["settings"], result["corpus"]
    out: list[str] = []
    add = out.append
    runs = result["runs"]
    device = machine(result)
    add(
        f"# Benchmark: real text, ours against transformers' run_mlm.py recipe ({result['date'][:10]}, {env['host']})\n"
    )
    add(
        f"{device}; torch {env['torch']}, transformers {env['transformers']}. Data: {corpus['bytes'] / MIB:.1f} MiB "
        f"of real English from this machine ({corpus['source']}), one example per line, {corpus['lines']:,} lines; "
        f"a {result['tokenizer_vocab']:,}-token WordPiece tokenizer trained on it. Every recipe trains the same "
        f"model from scratch on the whole file for {settings['max_steps']} optimizer steps of "
        f"{settings['batch_size']} samples (at most 128 tokens each); {settings['pairs']} pair(s), alternating "
        f"{' / '.join(settings['recipes'])}, each run a fresh torchrun process. Throughput counts real "
        "(non-padding) tokens over the steps after the first fifth; ratios are taken within each pair.\n"
    )
    for model, s in result["summary"].items():
        first = next(r for r in runs if r["model"] == model)
        add(
            f"## {model}: `{result['models'][model]}` ({first['probe']['parameters'] / 1e6:.1f} M parameters), "
            "real tokens/s ratios per pair: median [min – max]\n"
        )
        add("| comparison | ratio | per pair |")
        add("|---|---|---|")
        for c in s["comparisons"]:
            add(f"| {c['label']} | **{_ratio(c)}** | {', '.join(f'{v:.2f}' for v in c['values'])} |")
        add("")
        if s.get("wall"):
            add("Whole process (torchrun's start to its exit), wall clock per pair; above 1: ours finished first.\n")
            add("| comparison | ratio | per pair |")
            add("|---|---|---|")
            for c in s["wall"]:
                add(f"| {c['label']} | **{_ratio(c)}** | {', '.join(f'{v:.2f}' for v in c['values'])} |")
            add("")
        for share in s["head_share"]:
            values = ", ".join(f"{v:.0%}" for v in share["values"])
            add(
                f"The masked-only head's share of the speed-up ({share['padding']}, {share['label']}, on a log scale): "
                f"**{share['median']:.0%} [{share['min']:.0%} – {share['max']:.0%}]** (per pair: {values}).\n"
            )
        add("| recipe | what | real tokens per sample | real tokens/s | samples/s | wall s | first step s | peak MiB |"
            " final loss |")  # fmt: skip
        add("|---|---|---|---|---|---|---|---|---|")
        for name, r in s["recipes"].items():
            memory = {k: v / MIB for k, v in r["peak_memory_bytes"].items()}
            loss = _spread(r["final_loss"], ".3f") if r["final_loss"] else "–"
            add(
                f"| {name} | {result['recipes'][name]['what']} | {r['real_tokens_per_sample']:.1f} | "
                f"{_spread(r['real_tokens_per_s'], ',.0f')} | {_spread(r['samples_per_s'], ',.1f')} | "
                f"{_spread(r['wall_s'], '.1f')} | {_spread(r['first_step_s'], '.1f')} | {_spread(memory, ',.0f')} | "
                f"{loss} |"
            )
        add("")

    add("## Every run, in the order they ran\n")
    add(
        "| run | real tokens/s | samples/s | wall s | first step s | peak MiB | final loss | load avg (before, after) |"
    )
    add("|---|---|---|---|---|---|---|---|")
    for run in runs:
        load = ", ".join(f"{x:.1f}" for x in run["load_avg_1m"])
        add(
            f"| {run['label']} | {run['real_tokens_per_s']:,.0f} | {run['samples_per_s']:,.1f} | {run['wall_s']:.1f} | "
            f"{run['first_step_s']:.1f} | {run['peak_memory_bytes'] / MIB:,.0f} | {run['final_loss']:.3f} | {load} |"
        )
    add("")

    add("## Recipes\n")
    for name, recipe in result["recipes"].items():
        add(f"- **{name}** (`python -m {recipe['module']}`): {recipe['what']}; `{' '.join(recipe['flags'])}`")
    add(f"\n{REAL_NOTES}")
    return "\n".join(out) + "\n"


def startup_markdown(startup: dict[str, Any]) -> list[str]:
    """The report's start-up section."""
    out = ["## Start-up: imports and the demo run against the bare imports\n"]
    out.append("| what | import s | process s | / bare import |")
    out.append("|---|---|---|---|")
    for name, s in startup["imports"].items():
        out.append(
            f"| `{STARTUP_IMPORTS[name]}` | {_spread(s['import_s'], '.2f')} | {_spread(s['process_s'], '.2f')} | "
            f"{_spread(s['ratio_to_bare'], '.2f')} |"
        )
    demo = startup.get("demo")
    if demo:
        out.append(
            f"\nWarm 2-step demo run via entrypoint.sh to its end: {_spread(demo['wall_s'], '.1f')} s, first step "
            f"after {_spread(demo['first_step_s'], '.1f')} s, the steps themselves (train_runtime) "
            f"{_spread(demo['steps_s'], '.2f')} s."
        )
    out.append("\n| target | measured | target | met |")
    out.append("|---|---|---|---|")
    for row in startup["targets"]:
        out.append(
            f"| {row['what']} | {row['ratio']:.2f} | ≤ {row['target']:.1f} | {'yes' if row['met'] else '**no**'} |"
        )
    out.append("")
    return out


# ------------------------------------------------------------------------------------------------- heads series


def _range(s: dict[str, float], fmt: str) -> str:
    return f"{s['min']:{fmt}} – {s['max']:{fmt}}"
