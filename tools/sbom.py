"""Print a CycloneDX 1.6 JSON SBOM of the Python environment this interpreter runs in.

docker/build.sh (make image) runs it inside the image it has just built, fed on stdin, so the SBOM lists what
the image holds (pip and the local label of torch's build included, neither of which the locks say) and nothing
is added to the image for it:

    docker run --rm -i --network none --entrypoint /opt/venv/bin/python IMAGE - --image REF ... < tools/sbom.py

Standard library only (the image has no SBOM tool): each installed distribution as importlib.metadata reads it,
as cyclonedx-py's `environment` command would, with its purl and licence. The base image is a component of its
own, with its digest when the reference is pinned by one. Usage: python tools/sbom.py --help
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import sys
import uuid
from urllib.parse import quote

SCHEMA = "http://cyclonedx.org/schema/bom-1.6.schema.json"
# Our properties, namespaced as CycloneDX asks.
NS = "mlm-trainer"
DIGEST = re.compile(r"@(?P<alg>sha256):(?P<hex>[0-9a-f]{64})$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pypi_purl(name: str, version: str) -> str:
    # purl spec, pypi type: the normalized name; the version percent-encoded (2.13.0+cpu -> 2.13.0%2Bcpu).
    return f"pkg:pypi/{normalize(name)}@{quote(version, safe='')}"


def licenses(meta: importlib.metadata.PackageMetadata) -> list[dict]:
    """License-Expression (metadata 2.4), else the licence classifiers, else a one-line License field."""
    if expression := (meta.get("License-Expression") or "").strip():
        return [{"expression": expression}]
    names = [c.rsplit("::", 1)[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    names = [n for n in names if n not in ("OSI Approved", "")]
    if not names and (text := (meta.get("License") or "").strip()) and "\n" not in text and len(text) <= 100:
        names = [text]
    return [{"license": {"name": name}} for name in dict.fromkeys(names)]


def python_components() -> list[dict]:
    seen, components = set(), []
    for dist in importlib.metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if not name or (key := normalize(name)) in seen:  # the first on sys.path wins, as for an import
            continue
        seen.add(key)
        purl = pypi_purl(name, version)
        component = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        if summary := (dist.metadata.get("Summary") or "").strip():
            component["description"] = summary
        if found := licenses(dist.metadata):
            component["licenses"] = found
        components.append(component)
    return sorted(components, key=lambda c: normalize(c["name"]))


def registry_repository(repo: str) -> str:
    """A Docker Hub short name in full (nvidia/cuda -> docker.io/nvidia/cuda), as purl's repository_url wants."""
    first = repo.split("/", 1)[0]
    if "/" not in repo:
        return f"docker.io/library/{repo}"
    return repo if "." in first or ":" in first or first == "localhost" else f"docker.io/{repo}"


def base_component(ref: str, local_id: str) -> dict:
    """The base image: REPO:TAG@sha256:DIGEST as an OCI component; a local base (no digest) by its image ID."""
    digest = DIGEST.search(ref)
    repo_tag = ref[: digest.start()] if digest else ref
    repo, _, tag = repo_tag.rpartition(":") if ":" in repo_tag.rsplit("/", 1)[-1] else (repo_tag, "", "")
    component = {"type": "container", "bom-ref": "base-image", "name": repo, "version": tag or "latest"}
    if digest:
        component["hashes"] = [{"alg": "SHA-256", "content": digest["hex"]}]
        qualifiers = f"repository_url={registry_repository(repo)}" + (f"&tag={tag}" if tag else "")
        component["purl"] = f"pkg:oci/{repo.rsplit('/', 1)[-1]}@sha256%3A{digest['hex']}?{qualifiers}"
    elif local_id:
        component["properties"] = [{"name": f"{NS}:local-image-id", "value": local_id}]
    return component


def sbom(args: argparse.Namespace) -> dict:
    name, _, tag = args.image.rpartition(":") if ":" in args.image.rsplit("/", 1)[-1] else (args.image, "", "")
    properties = {
        "image": args.image,
        "image.id": args.image_id,
        "revision": args.revision,
        "base-image": args.base_image,
        "python": platform.python_version(),
        "python.executable": sys.executable,
    }
    bom = {
        "$schema": SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "mlm-trainer tools/sbom.py"}]},
            "component": {"type": "container", "bom-ref": "image", "name": name, "version": tag or "latest"},
            "properties": [{"name": f"{NS}:{k}", "value": v} for k, v in properties.items() if v],
        },
        "components": [base_component(args.base_image, args.base_image_id), *python_components()],
    }
    if args.created:
        bom["metadata"]["timestamp"] = args.created
    refs = [c["bom-ref"] for c in bom["components"]]
    bom["dependencies"] = [{"ref": "image", "dependsOn": refs}, *({"ref": r} for r in refs)]
    return bom


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="the image reference (REPO:TAG)")
    parser.add_argument("--image-id", default="", help="its ID (sha256:...)")
    parser.add_argument("--base-image", required=True, help="the FROM reference, REPO:TAG@sha256:... when pinned")
    parser.add_argument("--base-image-id", default="", help="the local base's ID, when the reference has no digest")
    parser.add_argument("--revision", default="", help="the source revision")
    parser.add_argument("--created", default="", help="the build time (ISO 8601, UTC)")
    json.dump(sbom(parser.parse_args(argv)), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
