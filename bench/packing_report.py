"""The packing series' summary and report (bench/packing.py has the settings and measurements; tested in
tests/bench/test_packing_series.py): efficiency per mode against its target, real tokens/s and the ratios taken
within a repeat, the held-out loss of documents kept apart against attending across, and the Markdown page."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from bench import heads, real
from bench.packing import (
    BLOCK,
    COMPARISONS,
    CROSSING,
    ISOLATED,
    MAX_ACCEPTED_LOAD_EXCESS,
    MODES,
    TARGETS,
    PackingSettings,
)
from bench.report import MIB, _range, _ratio, machine
from bench.stats import spread

SPEED_METRICS = ("real_tokens_per_s", "samples_per_s", "peak_memory_bytes", "wall_s")


def summarise(
    runs: list[dict[str, Any]], quality: list[dict[str, Any]], layout: dict[str, Any], settings: PackingSettings
) -> dict[str, Any]:
    """The efficiency of each mode against its target, and per architecture: each mode's speed (min / median /
    max), the ratios within each repeat, and the held-out losses per seed with crossing - isolated."""
    efficiency = {
        mode: {**facts, "target": TARGETS.get(mode),
               "met": facts["efficiency"] >= TARGETS[mode] - 1e-9 if mode in TARGETS else None}
        for mode, facts in layout.items()
    }  # fmt: skip
    per_architecture: dict[str, Any] = {}
    for name in settings.architectures:
        mine = [r for r in runs if r["architecture"] == name]
        modes = {}
        for mode in settings.modes:
            rs = [r for r in mine if r["recipe"] == mode]
            if rs:
                modes[mode] = {m: spread([r[m] for r in rs]) for m in SPEED_METRICS}
                modes[mode]["step_s"] = spread([heads.step_seconds(r) for r in rs])
                banner = [r["packing"]["efficiency"] for r in rs if (r.get("packing") or {}).get("efficiency")]
                modes[mode]["banner_efficiency"] = spread(banner) if banner else None
        ratios = []
        for comparison in COMPARISONS:
            values = list(real.paired(mine, comparison).values())
            if values:
                ratios.append({"label": comparison.label, "values": values, **spread(values)})
        per_architecture[name] = {
            "parameters": mine[0]["probe"]["parameters"] if mine else None,
            "modes": modes,
            "ratios": ratios,
            "quality": summarise_quality([q for q in quality if q["architecture"] == name]),
        }
    return {"efficiency": efficiency, "architectures": per_architecture}


def summarise_quality(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per seed the two held-out losses and crossing - isolated (seeds with both runs only), min / median / max."""
    losses: dict[int, dict[str, float]] = defaultdict(dict)
    for run in runs:
        losses[run["seed"]][run["recipe"]] = run["heldout"]["loss"]
    seeds = sorted(s for s, pair in losses.items() if ISOLATED in pair and CROSSING in pair)
    if not seeds:
        return None
    rows = [{"seed": s, "isolated": losses[s][ISOLATED], "crossing": losses[s][CROSSING]} for s in seeds]
    differences = [row["crossing"] - row["isolated"] for row in rows]
    # The quality runs are speed runs too, with a longer window: isolated / crossing real tokens/s per seed.
    speed = list(real.paired(runs, real.Comparison("", ISOLATED, CROSSING)).values())
    return {
        "seeds": rows,
        "speed": {"values": speed, **spread(speed)},
        "isolated": spread([row["isolated"] for row in rows]),
        "crossing": spread([row["crossing"] for row in rows]),
        "difference": {"values": differences, **spread(differences)},
        "isolated_lower": sum(d > 0 for d in differences),
    }


# ------------------------------------------------------------------------------------------------------- report

NOTES = (
    "Efficiency: real tokens / positions computed, from the job's own collator (train/model/collator.py `measure()`) "
    "in each mode's training-size batches of samples drawn at random, as the Trainer draws them; the banner's figure "
    "is the job's own (run.json `packing`: its first 256 samples in file order, where neighbouring lines have "
    "similar lengths, so it overstates what dynamic padding realises on a shuffled corpus whose line lengths "
    "have a long tail). It counts positions, not attention pairs: a packed row on "
    "SDPA still scores all 128 x 128 pairs under its block-diagonal mask, and a padding-free row all of its "
    "length squared (flash attention's varlen path computes only each document's). Tokens kept: the tokens a mode "
    "trains on, of all the corpus's tokens (specials included): packing drops each 1,000-line map batch's last "
    "partial block; dynamic padding and padding-free cut lines past 128 tokens. Real tokens/s: the Trainer's count "
    "over the steps after the first fifth; ratios are taken within each repeat (above 1: the first mode is "
    "faster). Held-out loss: the mean cross-entropy per masked token over the held-out documents, each evaluated "
    "alone after training, with the same masks for every model; crossing - isolated above 0: keeping documents "
    "apart gave the lower loss."
)


def run_line(run: dict[str, Any]) -> str:
    held = f", held-out loss {run['heldout']['loss']:.4f}" if run.get("heldout") else ""
    return (
        f"packing {run['label']}: {run['real_tokens_per_s']:,.0f} real tokens/s, {heads.step_seconds(run):.3f} "
        f"s/step, wall {run['wall_s']:.1f} s, final loss {run['final_loss']:.3f}{held}"
    )


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def shared_machine(runs: list[dict[str, Any]], threads: int | None) -> str:
    """A sentence on the load the runs saw: other work on the machine shows as a load average above the runs'."""
    loads = [x for r in runs for x in r["load_avg_1m"]]
    if not loads:
        return ""
    own = threads or 1
    peak = max(loads)
    if peak > own + MAX_ACCEPTED_LOAD_EXCESS:
        return (
            f"The machine was shared: other work ran beside the benchmark (1-minute load average up to {peak:.1f} "
            f"around the runs, which use {own} thread(s) each); the modes alternate, so it hit them alike, and "
            "the ratios are taken within each repeat. "
        )
    return f"The machine was otherwise idle (1-minute load average at most {peak:.1f} around the runs). "


def markdown(result: dict[str, Any]) -> str:
    """The packing series' report: efficiency per mode, then per architecture speed, ratios and held-out loss."""
    summary = result["summary"]
    out = _introduction(result)
    out += _efficiency(summary)
    for name, s in summary["architectures"].items():
        out += _speed(name, s)
        out += _speed_ratios(s["ratios"])
        out += _heldout_losses(name, s["quality"], result["settings"]["quality_steps"])
    out += _failures(result.get("failures") or [])
    out += _every_run(result["runs"] + result["quality_runs"])
    out += _flags(result)
    return "\n".join(out) + "\n"


def _introduction(result: dict[str, Any]) -> list[str]:
    """The title, and a paragraph on the machine, the data, the models, the speed and the quality runs."""
    env, settings, corpus, held = result["environment"], result["settings"], result["corpus"], result["heldout"]
    return [
        f"# Benchmark: packing modes, documents apart or across ({result['date'][:10]}, {env['host']})\n",
        f"{machine(result)}; torch {env['torch']}, transformers {env['transformers']}. Data: the real series' "
        f"{corpus['bytes'] / MIB:.1f} MiB of real English ({corpus['source']}), one document per line, less "
        f"{held['documents']:,} held-out lines ({held['tokens']:,} tokens); its WordPiece tokenizer "
        f"({result['tokenizer_vocab']:,} tokens). {', '.join(result['architectures'])} from scratch at the "
        f"{settings['size']} size (overrides under Flags), max_seq_length {BLOCK}, the masked-only head. Speed: "
        f"{settings['repeats']} repeat(s) of {' / '.join(settings['modes'])}, {settings['max_steps']} steps each, "
        f"{settings['blocks']} blocks ({settings['blocks'] * BLOCK:,} tokens) a step for the packed modes and as "
        "many real tokens on average for the others, each run a fresh torchrun process. Quality: "
        f"{settings['seeds']} seed(s), {ISOLATED} then {CROSSING}, {settings['quality_steps']} steps of "
        f"{settings['blocks']} blocks (the same blocks, masks and tokens for both), learning rate "
        f"{settings['learning_rate']:g} after {settings['warmup_steps']} warm-up steps. "
        + shared_machine(result["runs"] + result["quality_runs"], settings["threads"])
        + "\n",
    ]


def _efficiency(summary: dict[str, Any]) -> list[str]:
    """Per mode: its batches, its efficiency against the target, the banner's figure and the tokens it keeps."""
    out = ["## Packing efficiency: real tokens / positions computed\n"]
    out.append("| mode | what | examples per step | real tokens per example | efficiency | the banner's | target | "
               "tokens kept |")  # fmt: skip
    out.append("|---|---|---|---|---|---|---|---|")
    first = next(iter(summary["architectures"].values()), {"modes": {}})
    for mode, facts in summary["efficiency"].items():
        banner = (first["modes"].get(mode) or {}).get("banner_efficiency")
        if facts["target"] is None:
            goal = "–"
        else:
            goal = f"≥ {facts['target']:.0%}: {'met' if facts['met'] else '**not met**'}"
        out.append(
            f"| {mode} | {MODES[mode]} | {facts['batch']:,} | {facts['tokens_per_example']:.1f} | "
            f"**{facts['efficiency']:.1%}** ({facts['samples']:,} samples) | "
            f"{_range(banner, '.1%') if banner else '–'} | {goal} | {_pct(facts['tokens_kept'])} |"
        )
    out.append("")
    return out


def _speed(name: str, s: dict[str, Any]) -> list[str]:
    """One architecture's speed per mode, min – max over the repeats."""
    params = f"{s['parameters'] / 1e6:.1f} M parameters" if s["parameters"] else "no run"
    out = [f"## {name} ({params}): real tokens/s, min – max over the repeats\n"]
    out.append("| mode | real tokens/s | s/step | peak MiB | wall s |")
    out.append("|---|---|---|---|---|")
    for mode, m in s["modes"].items():
        memory = {k: v / MIB for k, v in m["peak_memory_bytes"].items()}
        out.append(
            f"| {mode} | {_range(m['real_tokens_per_s'], ',.0f')} | {_range(m['step_s'], '.3f')} | "
            f"{_range(memory, ',.0f')} | {_range(m['wall_s'], '.1f')} |"
        )
    out.append("")
    return out


def _speed_ratios(ratios: list[dict[str, Any]]) -> list[str]:
    """One architecture's real tokens/s ratios, taken within each repeat."""
    if not ratios:
        return []
    out = ["| real tokens/s ratio | median [min – max] | per repeat |", "|---|---|---|"]
    for c in ratios:
        out.append(f"| {c['label']} | **{_ratio(c)}** | {', '.join(f'{v:.2f}' for v in c['values'])} |")
    out.append("")
    return out


def _heldout_losses(name: str, q: dict[str, Any] | None, quality_steps: int) -> list[str]:
    """One architecture's held-out loss per seed, isolated against crossing, and the same runs' speed ratio."""
    if not q:
        return []
    out = [f"### {name}: held-out loss on whole documents, each alone (per masked token)\n"]
    out.append(f"| seed | isolated ({ISOLATED}) | crossing ({CROSSING}) | crossing − isolated |")
    out.append("|---|---|---|---|")
    for row in q["seeds"]:
        out.append(f"| {row['seed']} | {row['isolated']:.4f} | {row['crossing']:.4f} | "
                   f"{row['crossing'] - row['isolated']:+.4f} |")  # fmt: skip
    d, speed = q["difference"], q["speed"]
    out.append(
        f"| min – max | {_range(q['isolated'], '.4f')} | {_range(q['crossing'], '.4f')} | "
        f"**{d['min']:+.4f} – {d['max']:+.4f}** |"
    )
    out.append(
        f"\nIsolated lower in {q['isolated_lower']} of {len(q['seeds'])} seed(s). The same runs' real "
        f"tokens/s, isolated / crossing over {quality_steps} steps: **{_ratio(speed)}** (per seed: "
        f"{', '.join(f'{v:.2f}' for v in speed['values'])}).\n"
    )
    return out


def _failures(failures: list[dict[str, Any]]) -> list[str]:
    """A line per failed run, with the first line of its error."""
    if not failures:
        return []
    out = [
        f"- **{f['architecture']} {f['mode']}** failed ({f['label']}): {f['error'].splitlines()[0]}" for f in failures
    ]
    out.append("")
    return out


def _every_run(runs: list[dict[str, Any]]) -> list[str]:
    """Every run's figures, the speed runs then the quality runs, in the order they ran."""
    out = ["## Every run, in the order they ran\n"]
    out.append("| run | mode | batch | real tokens/s | s/step | wall s | first step s | peak MiB | final loss | "
               "held-out loss | load avg (before, after) |")  # fmt: skip
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        load = ", ".join(f"{x:.1f}" for x in run["load_avg_1m"])
        held_loss = f"{run['heldout']['loss']:.4f}" if run.get("heldout") else "–"
        out.append(
            f"| {run['label']} | {run['recipe']} | {run['probe']['samples_per_step']:,} | "
            f"{run['real_tokens_per_s']:,.0f} | {heads.step_seconds(run):.3f} | {run['wall_s']:.1f} | "
            f"{run['first_step_s']:.1f} | {run['peak_memory_bytes'] / MIB:,.0f} | {run['final_loss']:.3f} | "
            f"{held_loss} | {load} |"
        )
    out.append("")
    return out


def _flags(result: dict[str, Any]) -> list[str]:
    """Each architecture's and each mode's flags, and the notes on how the figures are counted."""
    out = ["## Flags\n"]
    for name, overrides in result["architectures"].items():
        out.append(f"- **{name}**: `--model_name_or_path scratch:{name} --config_overrides {overrides}`")
    for mode, flags in result["flags"].items():
        out.append(f"- **{mode}**: `{' '.join(flags)}`")
    out.append(f"\n{NOTES}")
    return out
