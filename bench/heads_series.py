"""Runs the heads series (its settings, architectures and summary: bench/heads.py): the real series' corpus and
tokenizer (bench/real_series.py), the config.json of an architecture that needs one, every run's cache, then each
architecture's dense and masked-only runs, pair after pair.

Results: ``bench/results/<date>-<host>-heads.json`` and ``.md``, and ``bench/results/latest-heads.md``; written after
each complete pair of an architecture, so a time limit keeps what was measured. An architecture whose run fails is
reported with the failure and left out of the later pairs; the others go on.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import heads, heads_report, report
from bench.real_series import prepare_real
from bench.runner import RunFailed, result_header, run_once, warm_cache, write_results


def results_stem(stem: str) -> str:
    """The heads series' result files sit beside the other series' of the same run, told apart by the suffix."""
    return f"{stem}-heads"


def model_sources(settings: heads.HeadsSettings, workdir: Path) -> dict[str, str]:
    """Per architecture, what its runs' model_name_or_path names: ``scratch:<type>``, or a config.json written
    here for the fields config_overrides cannot set (bench.heads.CONFIG_JSON_FIELDS)."""
    sources = {}
    for name in settings.architectures:
        fields = heads.config_json(name)
        if fields is None:
            sources[name] = f"scratch:{name}"
            continue
        path = workdir / "heads-configs" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fields, indent=1) + "\n", encoding="utf-8")
        sources[name] = str(path)
    return sources


def run_heads_series(settings: heads.HeadsSettings, workdir: Path, results_dir: Path, stem: str, tagged: bool) -> None:
    """Dense then masked-only for each architecture, pair after pair; the results written after each complete
    pair, the report printed at the end."""
    heads.check(settings)
    log = report.progress
    log(
        f"bench heads: {settings.device}, {settings.size} size, {settings.pairs} pair(s) of dense/masked-only for "
        f"{'/'.join(settings.architectures)}, {settings.max_steps} steps of {settings.batch_size} x 128 tokens; "
        f"in {workdir}"
    )
    corpus, tokenizer_dir, corpus_facts = prepare_real(heads.as_real(settings), workdir)
    sources = model_sources(settings, workdir)
    flags = {
        (name, head): heads.run_flags(name, head, settings, str(corpus), str(tokenizer_dir), sources[name])
        for name in settings.architectures
        for head in heads.HEADS
    }
    for name in settings.architectures:  # each config is built here: a misnamed field fails before any run
        warm_cache(flags[(name, "dense")])
    log(f"corpus: {corpus_facts['bytes'] / 2**20:.1f} MiB, {corpus_facts['lines']:,} lines; tokenizer {tokenizer_dir}")
    context = {
        **result_header(asdict(settings)),
        "corpus": corpus_facts,
        "architectures": heads.describe_architectures(settings, sources),
        "flags": heads.describe_flags(settings),
        "failures": [],
        "tagged": tagged,
    }
    runs: list[dict[str, Any]] = []
    markdown = ""
    failed: set[str] = set()
    for rep, name, head in heads.schedule(settings):
        if name in failed:
            continue
        try:
            run = run_once(head, flags[(name, head)], workdir, f"heads-{rep}-{name}-{head}", device=settings.device,
                           threads=settings.threads)  # fmt: skip
        except RunFailed as exc:  # one architecture's failure must not cost the others' figures
            failed.add(name)
            context["failures"].append({"architecture": name, "pair": rep, "head": head, "error": str(exc)})
            log(f"heads {name} pair {rep} {head} failed; {name} is left out of the later pairs: {exc}")
        else:
            run.update(architecture=name, rep=rep, step_s=heads.step_seconds(run))
            runs.append(run)
            log(heads_report.heads_run_line(run))
            if head != "masked-only":  # written once the pair is complete
                continue
        # <stem>-heads.json and .md and, untagged, latest-heads.md: what was measured so far
        result = {**context, "runs": runs, "summary": heads.summarise(runs, settings)}
        markdown = heads_report.heads_markdown(result)
        write_results(results_dir, results_stem(stem), result, markdown, None if tagged else "latest-heads.md")
    print(markdown)
    log(f"bench heads: results in {results_dir / results_stem(stem)}.json and .md")
