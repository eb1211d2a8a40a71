"""Real English text built from what is on the machine (never downloaded), for the data benchmarks.

Prose lines of the documentation files under /usr/share/doc and of the docstrings and comments of the installed
Python packages, in a fixed order, deduplicated; a corpus of a given size repeats them as often as it needs. Each
line is one example (the ``text`` builder's way, and run_mlm.py's ``line_by_line``).
"""

from __future__ import annotations

import gzip
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

ROOTS = [Path("/usr/share/doc"), Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
SUFFIXES = (".md", ".rst", ".txt", ".py")
WORD = re.compile(r"[A-Za-z][a-z]+")
MIN_WORDS = 6
# What the text is, in the words of a report's description of its data (the real series writes it to its results).
SOURCE = (
    "bench/corpus.py: prose lines of the documentation under /usr/share/doc and of the docstrings and comments of "
    "the installed Python packages, in a fixed order, repeated to the size"
)


def prose(line: str) -> str | None:
    """The line, if it reads as prose: at least MIN_WORDS words, and mostly letters (not code or tables)."""
    text = line.strip().lstrip("#*-> ").strip()
    if len(WORD.findall(text)) < MIN_WORDS:
        return None
    letters = sum(c.isalpha() or c == " " for c in text)
    return text if letters >= 0.85 * len(text) else None


def source_lines() -> Iterator[str]:
    seen: set[str] = set()
    for root in ROOTS:
        for path in sorted(root.rglob("*")):
            name = path.name.lower()
            if not path.is_file() or not (name.endswith(SUFFIXES) or name.endswith(".gz")):
                continue
            try:
                raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
            except (OSError, EOFError, gzip.BadGzipFile):
                continue
            for line in raw.decode("utf-8", errors="ignore").splitlines():
                text = prose(line)
                if text and text not in seen:
                    seen.add(text)
                    yield text


def write_corpus(path: Path, size_bytes: int) -> Path:
    """A text file of about ``size_bytes`` bytes of real lines (kept when it already exists at that size)."""
    if path.exists() and path.stat().st_size >= size_bytes:
        return path
    lines = list(source_lines())
    if not lines:
        raise SystemExit("bench.corpus: no documentation text found on this machine")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    written = 0
    with tmp.open("w", encoding="utf-8") as out:
        while written < size_bytes:
            for line in lines:
                out.write(line + "\n")
                written += len(line.encode()) + 1
                if written >= size_bytes:
                    break
    tmp.replace(path)
    return path


if __name__ == "__main__":
    target = Path(sys.argv[1])
    megabytes = float(sys.argv[2]) if len(sys.argv) > 2 else 20
    print(write_corpus(target, int(megabytes * 2**20)))
