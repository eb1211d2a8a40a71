"""Rewrite the torch line of requirements.lock so one lock serves the CPU and the CUDA builds.

pip-compile on a development machine resolves the local CPU wheel (``torch==2.13.0+cpu``) and records its
hash only. The image on a GPU machine installs PyPI's ``torch==2.13.0`` (CUDA 13.0). PEP 440 ignores the
local label when the pin has none, so ``torch==2.13.0`` accepts both, and pip accepts any listed hash:
we pin the public version and list the hashes of PyPI's Linux wheels next to the CPU wheel's.

Usage: python docker/lock_torch.py requirements.lock
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request

SIMPLE_API = "https://pypi.org/simple/torch/"
LINUX_WHEEL = re.compile(r"^torch-(?P<version>[^-]+)-cp31[12]-cp31[12]-manylinux_2_28_(x86_64|aarch64)\.whl$")


def pypi_linux_hashes(version: str) -> list[str]:
    request = urllib.request.Request(SIMPLE_API, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    return sorted(
        f["hashes"]["sha256"] for f in files if (m := LINUX_WHEEL.match(f["filename"])) and m["version"] == version
    )


def main(lock_path: str) -> None:
    text = open(lock_path, encoding="utf-8").read()
    torch_block = r"^torch==(?P<version>[0-9.]+)(\+\w+)? \\\n(?P<hashes>(    --hash=sha256:\w+ ?\\?\n)+)"
    block = re.search(torch_block, text, re.M)
    if block is None:
        sys.exit(f"{lock_path}: no torch==... line with hashes")
    version = block["version"]
    hashes = set(re.findall(r"sha256:(\w+)", block["hashes"])) | set(pypi_linux_hashes(version))
    lines = [f"torch=={version} \\"] + [f"    --hash=sha256:{h} \\" for h in sorted(hashes)]
    lines[-1] = lines[-1].removesuffix(" \\")
    new = text[: block.start()] + "\n".join(lines) + "\n" + text[block.end() :]
    open(lock_path, "w", encoding="utf-8").write(new)
    print(f"{lock_path}: torch=={version} with {len(hashes)} hashes (CPU wheel + PyPI Linux wheels)")


if __name__ == "__main__":
    main(sys.argv[1])
