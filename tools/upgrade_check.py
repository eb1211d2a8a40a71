"""What the newest releases of the training stack would break, before anyone moves the lock (`make upgrade-check`).

Resolves requirements.in and requirements-dev.in with the stack's pins lifted (torch, transformers, datasets,
accelerate, tokenizers, huggingface-hub, torchdata, safetensors: each at the newest release its index has that the
rest admits) into a scratch virtual environment, then runs there, in order:

1. the canaries of train/borrowed/ (tests/borrowed/): one per touch of a library's private parts, so a failure
   names the touch (what it reaches into, the version it was written against);
2. the fast tests (``-m "not slow"``);
3. one short training run through ./entrypoint.sh (the demo recipe, a few steps) with the scratch interpreter.

It prints the versions that moved, then what broke, by touch first, and exits 1 when anything did (0 when the
newest releases pass everything: move the lock with `make lock`, docs/image.md "Updating dependencies").

Usage: python -m tools.upgrade_check [--venv DIR] [--skip-install] [--keep-going]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The libraries whose releases decide what the job can do; everything else stays at the lock's version unless one of
# these needs it moved.
STACK = ("torch", "transformers", "datasets", "accelerate", "tokenizers", "huggingface-hub", "torchdata", "safetensors")
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(?P<version>[^\s;#]+)", re.M)
E2E_STEPS = 4


@dataclass(frozen=True)
class Broken:
    """One failed check: which stage, the test (or run) and the first line of what it said."""

    stage: str
    name: str
    message: str


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    return {normalize(m["name"]): m["version"] for m in PIN.finditer(text)}


def unpinned_requirements(path: Path) -> str:
    """requirements.in (or -dev.in) with the stack's ``==`` pins lifted and its ``-c`` lines dropped: the other pins
    (bounds a library needs, lockstep pairs) stay."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("-c "):
            continue
        match = PIN.match(line)
        if match and normalize(match["name"]) in STACK:
            line = match["name"]
        lines.append(line)
    return "\n".join(lines) + "\n"


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("upgrade-check: $ " + " ".join(command), flush=True)
    return subprocess.run(command, cwd=REPO, **kwargs)


def install(venv: Path) -> None:
    """A fresh venv with the newest stack; its pip chooses, as a `make lock` after lifting the pins would."""
    run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        wanted = Path(tmp) / "requirements.txt"
        wanted.write_text(
            unpinned_requirements(REPO / "requirements.in") + unpinned_requirements(REPO / "requirements-dev.in"),
            encoding="utf-8",
        )
        run([str(venv / "bin" / "pip"), "install", "--quiet", "--only-binary", ":all:", "-r", str(wanted)], check=True)


def installed(venv: Path) -> dict[str, str]:
    out = run([str(venv / "bin" / "pip"), "list", "--format", "json"], check=True, capture_output=True, text=True)
    return {normalize(p["name"]): p["version"].split("+")[0] for p in json.loads(out.stdout)}


def moved(locked: dict[str, str], now: dict[str, str]) -> list[str]:
    return [
        f"{name} {locked[name]} -> {now[name]}" for name in STACK if name in locked and locked[name] != now.get(name)
    ]


def failures(junit: Path, stage: str) -> list[Broken]:
    """The failed and errored test cases of a pytest --junitxml report, each with its message's first line."""
    if not junit.exists():
        return [Broken(stage, "pytest", "no report: the tests did not start (see the output above)")]
    broken = []
    for case in ElementTree.parse(junit).iter("testcase"):
        for outcome in ("failure", "error"):
            found = case.find(outcome)
            if found is not None:
                message = (found.get("message") or found.text or outcome).strip().splitlines()
                name = f"{case.get('classname', '')}::{case.get('name', '')}".removeprefix("tests.")
                broken.append(Broken(stage, name, message[0] if message else outcome))
    return broken


def pytest(venv: Path, stage: str, args: list[str]) -> list[Broken]:
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        python = str(venv / "bin" / "python")
        run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args])
        return failures(junit, stage)


def short_run(venv: Path) -> list[Broken]:
    """The demo recipe for a few steps through the real entrypoint and torchrun, with the scratch interpreter."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, MLM_PYTHON=str(venv / "bin" / "python"), MLM_CONFIG="configs/demo.yaml")
        env.update(MLM_OUTPUT_DIR=out, MLM_MAX_STEPS=str(E2E_STEPS), MLM_DEMO_SAMPLES="2000", MLM_NPROC_PER_NODE="1")
        env.update(MLM_EVAL_STEPS=str(E2E_STEPS), MLM_SAVE_STEPS=str(E2E_STEPS))
        done = run(["./entrypoint.sh"], env=env, capture_output=True, text=True)
        if done.returncode == 0 and (Path(out) / "final").is_dir():
            return []
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [Broken("e2e", f"./entrypoint.sh (demo, {E2E_STEPS} steps)", f"exit {done.returncode}: {last}")]


def report(moves: list[str], broken: list[Broken]) -> int:
    print("\nupgrade-check: versions, lock -> newest")
    for line in moves or ["(none: the lock already has the newest releases)"]:
        print(f"  {line}")
    if not broken:
        print("upgrade-check: nothing broke; `make lock` moves the lock (docs/image.md, 'Updating dependencies')")
        return 0
    print(f"upgrade-check: {len(broken)} broke")
    for stage in ("touch", "fast", "e2e"):
        for item in (b for b in broken if b.stage == stage):
            label = {"touch": "private touch", "fast": "fast test", "e2e": "short run"}[stage]
            print(f"  {label}: {item.name}: {item.message}")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO / "build" / "upgrade-check" / "venv")
    parser.add_argument("--skip-install", action="store_true", help="reuse --venv as it is")
    parser.add_argument("--keep-going", action="store_true", help="run every stage even when the canaries fail")
    args = parser.parse_args(argv)
    if not args.skip_install:
        install(args.venv)
    locked = pins((REPO / "requirements.lock").read_text(encoding="utf-8"))
    moves = moved(locked, installed(args.venv))
    broken = pytest(args.venv, "touch", ["tests/borrowed"])
    if not broken or args.keep_going:
        broken += pytest(args.venv, "fast", ["-m", "not slow", "--ignore=tests/borrowed"])
        broken += short_run(args.venv)
    return report(moves, broken)


if __name__ == "__main__":
    sys.exit(main())
