"""Vendor the OpenAPI schemas of the custom resources the overlays create, from the CRDs their projects release.

    python k8s/schemas/vendor.py                 # download each CRD at its pinned tag, write <kind>.json here
    python k8s/schemas/vendor.py --from DIR      # the same from local copies (DIR/<file name of the CRD>)

Each <kind>.json is the ``openAPIV3Schema`` of the CRD's storage version with the ``description`` texts removed
(documentation only, three quarters of the bytes) and a ``$comment`` naming its source. Change a pin in SOURCES
(tag and the commit it points to) and run this again; tests/e2e/test_k8s.py validates against these files.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

# kind: (repository, tag, commit of the tag, path of the CRD in the repository)
SOURCES = {
    "TrainJob": (
        "kubeflow/trainer",
        "v2.3.0",
        "658725bdae5c7e3a0854d93ac6ff492e109a22ab",
        "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    ),
    "TrainingRuntime": (
        "kubeflow/trainer",
        "v2.3.0",
        "658725bdae5c7e3a0854d93ac6ff492e109a22ab",
        "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
    ),
    "JobSet": (
        "kubernetes-sigs/jobset",
        "v0.12.0",
        "f22e565ac3cc3265c7c45ef67ecffdc689af5d77",
        "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
    ),
    "PyTorchJob": (
        "kubeflow/trainer",
        "v1.9.4",
        "4445c12aa62e4345b0c2c6ac9b215a70eca46ed7",
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
    ),
}


def without_descriptions(node: Any) -> Any:
    """The schema without its ``description`` keywords (a property *named* description, and values given as data:
    defaults, enums, are kept)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description":
                continue
            if key == "properties":
                out[key] = {name: without_descriptions(sub) for name, sub in value.items()}
            elif key in ("default", "enum", "example"):
                out[key] = value
            else:
                out[key] = without_descriptions(value)
        return out
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def vendored(kind: str, crd_text: str) -> dict[str, Any]:
    """The schema document written for ``kind`` from the CRD's YAML."""
    repo, tag, commit, path = SOURCES[kind]
    crd = yaml.safe_load(crd_text)
    if crd.get("kind") != "CustomResourceDefinition" or crd["spec"]["names"]["kind"] != kind:
        raise SystemExit(f"{path}: not the CustomResourceDefinition of {kind}")
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return {
        "$comment": (
            f"{kind} {crd['spec']['group']}/{version['name']}: openAPIV3Schema of https://github.com/{repo}/blob/"
            f"{tag}/{path} (commit {commit}), descriptions removed; written by k8s/schemas/vendor.py"
        ),
        **without_descriptions(version["schema"]["openAPIV3Schema"]),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source_dir", type=Path, help="read the CRDs from this directory")
    args = parser.parse_args(argv)
    for kind, (repo, tag, _commit, path) in SOURCES.items():
        if args.source_dir:
            text = (args.source_dir / Path(path).name).read_text()
        else:
            url = f"https://raw.githubusercontent.com/{repo}/{tag}/{path}"
            with urllib.request.urlopen(url, timeout=60) as response:
                text = response.read().decode()
        out = HERE / f"{kind.lower()}.json"
        out.write_text(json.dumps(vendored(kind, text), indent=0, sort_keys=True) + "\n")
        print(f"{out.relative_to(HERE.parents[1])}: {kind} from {repo}@{tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
