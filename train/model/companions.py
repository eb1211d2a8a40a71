"""What a pretrained model carries beside its encoder, kept in final/: a sentence-transformers model's modules.

Continued pretraining of an embedding model (all-MiniLM, e5, bge, ...) adapts its encoder to a domain; the user
then wants it back as the embedding model. transformers' ``save_pretrained`` writes the masked-LM model only, so
the files that make a directory a sentence-transformers model (``modules.json``, its pooling / normalisation /
dense modules, ``sentence_bert_config.json``, ``config_sentence_transformers.json``) would be lost. They are copied
into final/ with ``modules.json`` pointing its Transformer module at final/ itself (the trained encoder): final/
loads both as ``AutoModelForMaskedLM`` and as ``SentenceTransformer``. sentence-transformers is not a dependency of
the image: these are its documented file formats, read as JSON and copied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from huggingface_hub import snapshot_download

from train.model.weights import weights_directory

MODULES = "modules.json"
CONFIGS = ("sentence_bert_config.json", "config_sentence_transformers.json")
# A hub model's module files, fetched with its weights (small JSON files: pooling, normalisation, dense layers).
HUB_PATTERNS = [MODULES, *CONFIGS, "*_Pooling/*", "*_Normalize/*", "*_Dense/*"]


def companion_directory(name: str) -> Path | None:
    """Where a pretrained model's sentence-transformers files are: its local directory or hub snapshot; for a hub
    model whose snapshot lacks them, they are fetched (small files; nothing when offline or not such a model)."""
    directory = weights_directory(name)
    if directory is None or (directory / MODULES).is_file() or Path(name).expanduser().exists():
        return directory
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_PATTERNS))
    except Exception:  # noqa: BLE001 - offline, gated, unreachable: the MLM model is final/ either way
        return directory


def keep_sentence_transformers(source: Path | None, final: Path) -> str | None:
    """Copy ``source``'s sentence-transformers files into ``final`` around the trained encoder; the one line that
    says what was kept (and what could not be), or None when ``source`` is no sentence-transformers model."""
    if source is None or not (source / MODULES).is_file():
        return None
    modules = json.loads((source / MODULES).read_text(encoding="utf-8"))
    kept, lost = [], []
    for module in modules:
        path = module.get("path", "")
        if str(module.get("type", "")).endswith("Transformer"):
            module["path"] = ""  # the encoder is final/ itself, trained; an older copy beside it is not kept
        elif path and (source / path).is_dir():
            shutil.copytree(source / path, final / path, dirs_exist_ok=True)
            kept.append(path)
        elif path:
            lost.append(path)
    (final / MODULES).write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    for name in CONFIGS:
        if (source / name).is_file():
            shutil.copy2(source / name, final / name)
    line = (
        f"final/ keeps the sentence-transformers modules around the trained encoder ({', '.join(kept) or 'no other'}"
        "): it loads as SentenceTransformer too"
    )
    if lost:
        line += f"; not kept: {', '.join(lost)} (listed in {MODULES} but not in {source})"
    return line
