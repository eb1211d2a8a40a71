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

from train.common.errors import ConfigError, first_line
from train.common.paths import first_link_under, inside, regular_file
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


def read_modules(source: Path) -> list[dict[str, object]]:
    """``source``'s modules.json, checked as data (train/common/paths.py's rule): a list of modules whose paths are
    folders inside ``source`` holding regular files only, and config files that are regular files; ConfigError
    naming the file and what is wrong. A handed-over model is someone else's directory: a link or a ``..`` there
    would copy another file into final/ (and a push would publish it) or write outside it."""
    modules: object = None
    problem = regular_file(source, MODULES)
    if problem is None:
        try:
            modules = json.loads((source / MODULES).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            problem = f"{MODULES}: does not parse ({first_line(exc)})"
    problem = problem or modules_problem(source, modules)
    if problem or not isinstance(modules, list):
        raise ConfigError(f"{source}: {problem}; final/ keeps only regular files inside the model's directory")
    return modules


def modules_problem(source: Path, modules: object) -> str | None:
    if not (isinstance(modules, list) and all(isinstance(m, dict) for m in modules)):
        return f"{MODULES}: not a list of modules"
    for module in modules:
        path = module.get("path", "")
        if not isinstance(path, str):
            return f"{MODULES}: a module's path is {path!r}, not a folder name"
        if not path or is_encoder(module):
            continue
        wrong = inside(source, path)
        link = first_link_under(source / path) if wrong is None and (source / path).is_dir() else None
        if wrong or link:
            return wrong or f"{path}/{link} is a symbolic link"
    for name in CONFIGS:
        wrong = regular_file(source, name) if (source / name).exists() or (source / name).is_symlink() else None
        if wrong:
            return wrong
    return None


def is_encoder(module: dict[str, object]) -> bool:
    return str(module.get("type", "")).endswith("Transformer")


def check_companions(source: Path | None) -> None:
    """Before training: ``source``'s sentence-transformers files are fit to keep (:func:`read_modules`)."""
    if source is not None and ((source / MODULES).exists() or (source / MODULES).is_symlink()):
        read_modules(source)


def keep_sentence_transformers(source: Path | None, final: Path) -> str | None:
    """Copy ``source``'s sentence-transformers files into ``final`` around the trained encoder; the one line that
    says what was kept, or None when ``source`` is no sentence-transformers model. A module with no folder (a
    Normalize module has no files) keeps its entry and gets an empty folder, as sentence-transformers saves it."""
    if source is None or not (source / MODULES).is_file():
        return None
    modules = read_modules(source)  # checked again: the directory may have changed since training started
    kept = []
    for module in modules:
        path = str(module.get("path", ""))
        if is_encoder(module):
            module["path"] = ""  # the encoder is final/ itself, trained; an older copy beside it is not kept
        elif path and (source / path).is_dir():
            shutil.copytree(source / path, final / path, dirs_exist_ok=True)
            kept.append(path)
        elif path:
            (final / path).mkdir(parents=True, exist_ok=True)
            kept.append(path)
    (final / MODULES).write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    for name in CONFIGS:
        if (source / name).is_file():
            shutil.copy2(source / name, final / name)
    return (
        f"final/ keeps the sentence-transformers modules around the trained encoder ({', '.join(kept) or 'no other'}"
        "): it loads as SentenceTransformer too"
    )
