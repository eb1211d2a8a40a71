"""The versions of Python and of the libraries a run depends on, as the banner and run.json record them."""

from __future__ import annotations

import platform
from importlib import metadata

PACKAGES = ("torch", "transformers", "datasets", "accelerate", "tokenizers", "nvidia-ml-py")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
