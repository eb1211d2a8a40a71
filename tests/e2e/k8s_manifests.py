"""Render the k8s/ overlays, and play the controllers that turn a pod template into a running pod's environment.

Shared by test_k8s.py (the launch plan of node 0 and node 1 of every overlay) and test_two_hosts.py (the Indexed
Job's environment on two network namespaces). What each controller adds is taken from its source:
- batch/v1 Job (completionMode: Indexed): JOB_COMPLETION_INDEX in every container, the completion index as the
  ``batch.kubernetes.io/job-completion-index`` annotation and label, hostname ``<job>-<index>``.
- Kubeflow Training Operator v1 (pkg/controller.v1/pytorch/envvar.go, master.go): PYTHONUNBUFFERED, MASTER_ADDR /
  PET_MASTER_ADDR = ``<job>-master-0``, MASTER_PORT / PET_MASTER_PORT = the ``pytorchjob-port`` container port,
  WORLD_SIZE, RANK, PET_NPROC_PER_NODE = spec.nprocPerNode, PET_NODE_RANK (workers: index + 1), PET_NNODES.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = ("single-node", "multi-node-pytorchjob", "multi-node-indexed")
MULTI_NODE = ("multi-node-pytorchjob", "multi-node-indexed")

Doc = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl not found on PATH: it renders the k8s/ overlays (`kubectl kustomize`, offline)")
    return path


def render(overlay: str) -> list[Doc]:
    """``kubectl kustomize k8s/overlays/<overlay>`` as a list of documents."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def find(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''} in the rendered overlay, found {len(matches)}"
    return matches[0]


def workload(docs: list[Doc]) -> Doc:
    """The one Job or PyTorchJob of an overlay."""
    found = [d for d in docs if d["kind"] in ("Job", "PyTorchJob")]
    assert len(found) == 1, f"expected one Job or PyTorchJob, found {[d['kind'] for d in found]}"
    return found[0]


def pod_templates(docs: list[Doc]) -> dict[str, Doc]:
    """Every pod template of the overlay's workload, by role (Job; or Master and Worker)."""
    job = workload(docs)
    if job["kind"] == "Job":
        return {"Job": job["spec"]["template"]}
    return {role: spec["template"] for role, spec in job["spec"]["pytorchReplicaSpecs"].items()}


def container(template: Doc) -> Doc:
    containers = template["spec"]["containers"]
    assert len(containers) == 1, "the trainer pod has exactly one container"
    return containers[0]


def nodes(docs: list[Doc]) -> int:
    """How many nodes (pods) the workload runs on."""
    job = workload(docs)
    if job["kind"] == "Job":
        return int(job["spec"].get("completions", 1))
    return sum(int(spec.get("replicas", 1)) for spec in job["spec"]["pytorchReplicaSpecs"].values())


@dataclass
class Pod:
    """One pod of the workload as its controller creates it."""

    role: str  # Job, Master or Worker
    template: Doc
    env: dict[str, str]  # the container's environment, values resolved
    hostname: str


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _field(fields: Doc, path: str) -> str:
    match = _FIELD.match(path)
    if match:
        return str(fields["metadata"][match.group(1)][match.group(2)])
    value: Any = fields
    for part in path.split("."):
        value = value[part]
    return str(value)


def resolve_env(entries: list[Doc], fields: Doc, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """A container's ``env`` as the kubelet resolves it: literals with $(VAR) expansion, downward-API fieldRefs,
    secretKeyRefs (an optional one whose Secret is absent is left out)."""
    env: dict[str, str] = {}
    for entry in entries:
        name = entry["name"]
        if "value" in entry:
            env[name] = _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(entry["value"]))
            continue
        source = entry.get("valueFrom", {})
        if "fieldRef" in source:
            env[name] = _field(fields, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secrets.get(ref["name"], {}).get(ref["key"])
            if value is not None:
                env[name] = value
            elif not ref.get("optional"):
                raise AssertionError(f"{name}: Secret {ref['name']}/{ref['key']} is required; the pod would not start")
        else:
            raise AssertionError(f"{name}: valueFrom {sorted(source)} is not simulated")
    return env


def pod_for_node(docs: list[Doc], node_rank: int, secrets: dict[str, dict[str, str]] | None = None) -> Pod:
    """The pod that runs node ``node_rank``, with the environment its controller and the kubelet give it."""
    job = workload(docs)
    name = job["metadata"]["name"]
    secrets = secrets or {}
    if job["kind"] == "Job":
        template = job["spec"]["template"]
        indexed = job["spec"].get("completionMode") == "Indexed"
        assert indexed or node_rank == 0, "a NonIndexed Job has one node"
        index = str(node_rank)
        fields: Doc = {
            "metadata": {
                "name": f"{name}-{index}-x7k2p" if indexed else f"{name}-x7k2p",
                "namespace": "default",
                "labels": {**template["metadata"].get("labels", {}), "batch.kubernetes.io/job-name": name},
                "annotations": {"batch.kubernetes.io/job-completion-index": index} if indexed else {},
            },
            "status": {"podIP": f"10.0.0.{10 + node_rank}"},
        }
        env = resolve_env(container(template).get("env", []), fields, secrets)
        if indexed:
            env["JOB_COMPLETION_INDEX"] = index
        hostname = f"{name}-{index}" if indexed else fields["metadata"]["name"]
        return Pod("Job", template, env, hostname)

    replicas = job["spec"]["pytorchReplicaSpecs"]
    role, index = ("Master", 0) if node_rank == 0 else ("Worker", node_rank - 1)
    template = replicas[role]["template"]
    pod_name = f"{name}-{role.lower()}-{index}"
    fields = {
        "metadata": {"name": pod_name, "namespace": "default", "labels": template["metadata"].get("labels", {})},
        "status": {"podIP": f"10.0.0.{10 + node_rank}"},
    }
    env = resolve_env(container(template).get("env", []), fields, secrets)
    master_port = next(
        str(port["containerPort"])
        for port in container(replicas["Master"]["template"]).get("ports", [])
        if port.get("name") == "pytorchjob-port"
    )
    nproc = str(job["spec"].get("nprocPerNode", "auto"))
    total = nodes(docs)
    env.update(
        PYTHONUNBUFFERED="0",
        MASTER_PORT=master_port,
        PET_MASTER_PORT=master_port,
        MASTER_ADDR=f"{name}-master-0",
        PET_MASTER_ADDR=f"{name}-master-0",
        WORLD_SIZE=str(total * (int(nproc) if nproc.isdigit() else 1)),
        RANK=str(node_rank),
        PET_NPROC_PER_NODE=nproc,
        PET_NODE_RANK=str(node_rank),
        PET_NNODES=str(total),
    )
    return Pod(role, template, env, pod_name)


def mount_paths(template: Doc, shared: Path, private: Path) -> dict[str, Path]:
    """Each volume mount of the trainer container as a local directory: PersistentVolumeClaims under ``shared`` (all
    nodes see the same files, as with a ReadWriteMany claim), emptyDirs under ``private`` (one per pod)."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    paths = {}
    for mount in container(template).get("volumeMounts", []):
        if mount["mountPath"] == "/dev/shm":
            continue  # the host's own /dev/shm serves
        root = shared if "persistentVolumeClaim" in volumes[mount["name"]] else private
        local = root / mount["mountPath"].strip("/").replace("/", "_")
        local.mkdir(parents=True, exist_ok=True)
        paths[mount["mountPath"]] = local
    return paths


def relocate(env: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
    """Point values under a mount path (/output, /cache/huggingface, ...) at the local directory standing in for it."""
    out = {}
    for name, value in env.items():
        for mount_path, local in mounts.items():
            if value == mount_path or value.startswith(mount_path + "/"):
                value = str(local) + value[len(mount_path) :]
                break
        out[name] = value
    return out
