"""Render the k8s/ overlays, and play the controllers that turn a pod template into a running pod's environment.

Shared by test_k8s.py and test_k8s_bucket.py (the launch plan of node 0 and node 1 of every overlay) and test_two_hosts.py (the Indexed
Job's environment on two network namespaces). What each controller adds is taken from its source:
- batch/v1 Job (completionMode: Indexed): JOB_COMPLETION_INDEX in every container, the completion index as the
  ``batch.kubernetes.io/job-completion-index`` annotation and label, hostname ``<job>-<index>``.
- Kubeflow Training Operator v1 (pkg/controller.v1/pytorch/envvar.go, master.go): PYTHONUNBUFFERED, MASTER_ADDR /
  PET_MASTER_ADDR = ``<job>-master-0``, MASTER_PORT / PET_MASTER_PORT = the ``pytorchjob-port`` container port,
  WORLD_SIZE, RANK, PET_NPROC_PER_NODE = spec.nprocPerNode, PET_NODE_RANK (workers: index + 1), PET_NNODES.
- JobSet v0.12.0 (kubernetes-sigs/jobset f22e565a, pkg/controllers/jobset_controller.go constructJob,
  pkg/util/placement/placement.go): child Job ``<jobset>-<replicatedJob>-<jobIndex>``, Indexed (the webhook's
  default), pods with the ``jobset.sigs.k8s.io/*`` labels and the subdomain ``<jobset>``; the Job controller then
  names each pod's host ``<job>-<completionIndex>``, i.e. ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>``.
- Kubeflow Trainer v2.3.0 (kubeflow/trainer 658725bd): the TrainJob becomes a JobSet of its name from the
  runtime's template (pkg/runtime/framework/plugins/jobset/builder.go Trainer: the TrainJob's image, command, args
  replace the ``node`` container's, its env is upserted), and pkg/runtime/framework/plugins/torch/torch.go
  EnforceMLPolicy upserts PET_NNODES (trainer.numNodes, else mlPolicy.numNodes), PET_NPROC_PER_NODE
  (trainer.numProcPerNode, else ``auto``, or the CPU count when the node asks for no GPU), PET_NODE_RANK (fieldRef:
  the ``batch.kubernetes.io/job-completion-index`` annotation), PET_MASTER_ADDR ``<trainjob>-node-0-0.<trainjob>``
  and PET_MASTER_PORT 29500; with the TrainJobStatus feature gate, plugins/trainjobstatus/trainjobstatus.go adds
  KUBEFLOW_TRAINER_SERVER_URL, _CA_CERT and _TOKEN.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.runs import entrypoint

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = (
    "single-node",
    "multi-node-pytorchjob",
    "multi-node-indexed",
    "jobset",
    "trainjob",
    "finetune-checkpoints",
    "branches",
)
MULTI_NODE = ("multi-node-pytorchjob", "multi-node-indexed", "jobset", "trainjob")
SHARED_CLAIMS = (*MULTI_NODE, "branches")  # pods on several nodes mount the same claims: ReadWriteMany
WORKLOAD_KINDS = ("Job", "PyTorchJob", "JobSet", "TrainJob")

# Kubeflow Trainer v2 (pkg/constants/constants.go at v2.3.0): the trainer's replicated Job and container name, the
# label that marks the trainer's replicated Job, the rendezvous port, the Job controller's completion index.
TRAINER_NODE = "node"
TRAINER_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_PORT = 29500
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

Doc = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl not found on PATH: it renders the k8s/ overlays (`kubectl kustomize`, offline)")
    return path


def render(overlay: str, k8s: Path = K8S) -> list[Doc]:
    """``kubectl kustomize k8s/overlays/<overlay>`` as a list of documents (``k8s``: another copy of k8s/)."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(k8s / "overlays" / overlay)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def find(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''} in the rendered overlay, found {len(matches)}"
    return matches[0]


def workload(docs: list[Doc]) -> Doc:
    """The one Job, PyTorchJob, JobSet or TrainJob of an overlay."""
    found = [d for d in docs if d["kind"] in WORKLOAD_KINDS]
    assert len(found) == 1, f"expected one of {WORKLOAD_KINDS}, found {[d['kind'] for d in found]}"
    return found[0]


def runtime_of(docs: list[Doc], trainjob: Doc) -> Doc:
    """The TrainingRuntime (or ClusterTrainingRuntime) a TrainJob names; it must be in the overlay."""
    ref = trainjob["spec"]["runtimeRef"]
    return find(docs, ref.get("kind", "ClusterTrainingRuntime"), ref["name"])


def jobset_spec(docs: list[Doc]) -> Doc:
    """The JobSet spec the pods come from: the JobSet's own, or the one a TrainJob's runtime carries."""
    job = workload(docs)
    if job["kind"] == "JobSet":
        return job["spec"]
    assert job["kind"] == "TrainJob", f"{job['kind']} is not run through a JobSet"
    return runtime_of(docs, job)["spec"]["template"]["spec"]


def trainer_replicated_job(docs: list[Doc]) -> Doc:
    """The replicated Job that runs the nodes: the JobSet's one, or the runtime's with the trainer ancestor label."""
    replicated = jobset_spec(docs)["replicatedJobs"]
    if workload(docs)["kind"] == "TrainJob":
        replicated = [
            r
            for r in replicated
            if r["template"].get("metadata", {}).get("labels", {}).get(TRAINER_ANCESTOR_LABEL) == "trainer"
        ]
    assert len(replicated) == 1, "the trainer runs as one replicated Job"
    return replicated[0]


def pod_templates(docs: list[Doc]) -> dict[str, Doc]:
    """Every pod template of the overlay's workload, by role (Job; Master and Worker; the replicated Job's name)."""
    job = workload(docs)
    if job["kind"] == "Job":
        return {"Job": job["spec"]["template"]}
    if job["kind"] == "PyTorchJob":
        return {role: spec["template"] for role, spec in job["spec"]["pytorchReplicaSpecs"].items()}
    replicated = trainer_replicated_job(docs)
    return {replicated["name"]: replicated["template"]["spec"]["template"]}


def container(template: Doc) -> Doc:
    containers = template["spec"]["containers"]
    assert len(containers) == 1, "the trainer pod has exactly one container"
    return containers[0]


def nodes(docs: list[Doc]) -> int:
    """How many nodes (pods) the workload runs on."""
    job = workload(docs)
    if job["kind"] == "Job":
        return int(job["spec"].get("completions", 1))
    if job["kind"] == "PyTorchJob":
        return sum(int(spec.get("replicas", 1)) for spec in job["spec"]["pytorchReplicaSpecs"].values())
    if job["kind"] == "TrainJob":
        runtime = runtime_of(docs, job)
        return int(job["spec"].get("trainer", {}).get("numNodes") or runtime["spec"]["mlPolicy"].get("numNodes", 1))
    replicated = trainer_replicated_job(docs)
    return int(replicated.get("replicas", 1)) * int(replicated["template"]["spec"].get("completions", 1))


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


def _upsert(env: list[Doc], entries: list[Doc]) -> None:
    """Kubeflow Trainer's apply.UpsertEnvVars: replace the entry of the same name in place, else append."""
    for entry in entries:
        names = [e["name"] for e in env]
        if entry["name"] in names:
            env[names.index(entry["name"])] = entry
        else:
            env.append(entry)


def _quantity(value: object) -> int:
    """A Kubernetes quantity's Value() for the plain counts used here (``8``, ``32``, ``500m`` rounds up to 1)."""
    text = str(value)
    return -(-int(text[:-1]) // 1000) if text.endswith("m") else int(text)


def _gpus(resources: Doc) -> int:
    """runtime.GetNumGPUPerNode: the first resource named like a GPU in requests, else in limits."""
    for kind in ("requests", "limits"):
        count = next((_quantity(q) for r, q in resources.get(kind, {}).items() if "gpu" in r.lower()), 0)
        if count:
            return count
    return 0


def trainjob_node_env(docs: list[Doc], status_server: bool = False) -> list[Doc]:
    """The ``node`` container's env entries in the JobSet Kubeflow Trainer v2.3.0 builds for the overlay's TrainJob
    (pkg/runtime/framework/plugins/torch/torch.go EnforceMLPolicy; ``status_server``: the TrainJobStatus gate on,
    plugins/trainjobstatus/trainjobstatus.go)."""
    trainjob = workload(docs)
    name = trainjob["metadata"]["name"]
    trainer = trainjob["spec"].get("trainer", {})
    box = container(pod_templates(docs)[TRAINER_NODE])
    assert box["name"] == TRAINER_NODE, "Kubeflow Trainer gives PET_* only to the container named node"
    env = [dict(e) for e in box.get("env", [])]
    _upsert(env, trainer.get("env", []))
    resources = trainer.get("resourcesPerNode") or box.get("resources", {})
    nproc = str(trainer["numProcPerNode"]) if "numProcPerNode" in trainer else "auto"
    if nproc == "auto" and _gpus(resources) == 0:
        cpu = resources.get("requests", {}).get("cpu") or resources.get("limits", {}).get("cpu") or 0
        nproc = str(max(1, _quantity(cpu)))
    _upsert(
        env,
        [
            {"name": "PET_NNODES", "value": str(nodes(docs))},
            {"name": "PET_NPROC_PER_NODE", "value": nproc},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
            },
            {"name": "PET_MASTER_ADDR", "value": f"{name}-{TRAINER_NODE}-0-0.{name}"},
            {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
        ],
    )
    if status_server:
        root = "/var/run/secrets/kubeflow/trainer"
        url = f"https://kubeflow-trainer-controller-manager.kubeflow-system.svc:10443/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{name}/status"
        _upsert(
            env,
            [
                {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": url},
                {"name": "KUBEFLOW_TRAINER_SERVER_CA_CERT", "value": f"{root}/ca.crt"},
                {"name": "KUBEFLOW_TRAINER_SERVER_TOKEN", "value": f"{root}/token"},
            ],
        )
    return env


def _jobset_pod(docs: list[Doc], node_rank: int, secrets: dict[str, dict[str, str]], status_server: bool) -> Pod:
    """Node ``node_rank`` of a JobSet (or of the JobSet a TrainJob becomes): pod ``node_rank`` of the one Job."""
    job = workload(docs)
    jobset = job["metadata"]["name"]  # a TrainJob's JobSet has the TrainJob's name
    replicated = trainer_replicated_job(docs)
    assert int(replicated.get("replicas", 1)) == 1, "one Job, one pod per node"
    assert replicated["template"]["spec"].get("completionMode", "Indexed") == "Indexed"
    template = replicated["template"]["spec"]["template"]
    child = f"{jobset}-{replicated['name']}-0"
    index = str(node_rank)
    fields: Doc = {
        "metadata": {
            "name": f"{child}-{index}-x7k2p",
            "namespace": "default",
            "labels": {
                **template["metadata"].get("labels", {}),
                "jobset.sigs.k8s.io/jobset-name": jobset,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-name": child,
                COMPLETION_INDEX: index,
            },
            "annotations": {COMPLETION_INDEX: index},
        },
        "status": {"podIP": f"10.0.0.{10 + node_rank}"},
    }
    entries = (
        trainjob_node_env(docs, status_server) if job["kind"] == "TrainJob" else container(template).get("env", [])
    )
    env = resolve_env(entries, fields, secrets)
    env["JOB_COMPLETION_INDEX"] = index  # the Job controller, Indexed Job
    return Pod(replicated["name"], template, env, f"{child}-{index}")


def pod_for_node(
    docs: list[Doc], node_rank: int, secrets: dict[str, dict[str, str]] | None = None, status_server: bool = False
) -> Pod:
    """The pod that runs node ``node_rank``, with the environment its controller and the kubelet give it
    (``status_server``: Kubeflow Trainer's TrainJobStatus feature gate is on)."""
    job = workload(docs)
    name = job["metadata"]["name"]
    secrets = secrets or {}
    if job["kind"] in ("JobSet", "TrainJob"):
        return _jobset_pod(docs, node_rank, secrets, status_server)
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


# --- the custom resources' schemas (k8s/schemas/README.md) -----------------------------------------------------------

SCHEMAS = K8S / "schemas"
# apiVersion, kind -> the vendored openAPIV3Schema of its CRD.
CUSTOM_RESOURCES = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjob.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainingruntime.json",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.json",
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjob.json",
}
CUSTOM_API_GROUPS = ("kubeflow.org/", "trainer.kubeflow.org/", "jobset.x-k8s.io/", "kueue.x-k8s.io/")
OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def is_custom(doc: Doc) -> bool:
    return doc["apiVersion"].startswith(CUSTOM_API_GROUPS)


def _strict(node: Any) -> Any:
    """What `kubectl apply` (server-side field validation Strict) enforces on a structural schema: a field the schema
    does not name is an error. Every object schema without additionalProperties or
    x-kubernetes-preserve-unknown-fields gets ``additionalProperties: false``."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf"):
            out[key] = _strict(value)
        else:
            out[key] = value
    if (
        out.get("type") == "object"
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator(api_version: str, kind: str, kubernetes_version: str) -> Any:
    """A jsonschema validator for one custom resource: its vendored CRD schema made strict, apiVersion and kind
    fixed, and metadata checked as Kubernetes' ObjectMeta (kubernetes-validate's schemas for that version)."""
    import importlib.resources

    import jsonschema
    from referencing import Registry, Resource

    schema = _strict(json.loads((SCHEMAS / CUSTOM_RESOURCES[(api_version, kind)]).read_text()))
    schema["$id"] = f"https://kubernetes.io/crd/{kind.lower()}.json"
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = {"$ref": OBJECT_META}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    definitions = (
        importlib.resources.files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{kubernetes_version}-local-strict"
        / "_definitions.json"
    )
    registry = Registry().with_resource(
        "https://kubernetes.io/api/_definitions.json", Resource.from_contents(json.loads(definitions.read_text()))
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_errors(doc: Doc, kubernetes_version: str) -> list[str]:
    """Every violation of its CRD's schema in one custom resource, as ``path: message`` lines."""
    validator = crd_validator(doc["apiVersion"], doc["kind"], kubernetes_version)
    return sorted(
        f"{doc['kind']}/{doc['metadata'].get('name')} {'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(doc)
    )


# --- validating, and the launcher given a pod's environment (test_k8s.py, test_k8s_bucket.py) ---------------------

# A current Kubernetes that kubernetes-validate bundles schemas for.
KUBERNETES_VERSION = "1.34.0"
IMAGE = "ghcr.io/mlm-trainer/mlm-trainer"  # the image the overlays name, pinned by digest


def validate(docs: list[dict], tmp_path: Path) -> subprocess.CompletedProcess:
    """kubernetes-validate --strict (unknown fields are errors) on the documents, as CI runs it: the command's own
    per-file function in this process, on the manifest as written (its command line took 1.3 s to start for each
    0.03 s check); its exit code and what it printed."""
    from kubernetes_validate import utils

    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = utils.validate_file(str(manifest), KUBERNETES_VERSION, strict=True, quiet=False, no_warn=False)
    return subprocess.CompletedProcess(["kubernetes-validate", "--strict", str(manifest)], code, printed.getvalue(), "")


def as_pod_templates(docs: list[dict]) -> list[dict]:
    """Each pod template of the workload wrapped as a core/v1 PodTemplate, so it is validated as a PodTemplateSpec."""
    return [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"mlm-trainer-{role.lower()}"}, "template": t}
        for role, t in pod_templates(docs).items()
    ]


def assert_header_says_how_to_run_it(overlay: str) -> None:
    """The overlay's header comment holds the commands to pin the image, apply, watch, read logs and clean up."""
    text = (K8S / "overlays" / overlay / "kustomization.yaml").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for word in ("apply:", "watch:", "logs:", "clean up:"):
        assert word in header, f"{overlay}: header lacks {word!r}"
    assert f"kubectl apply -k k8s/overlays/{overlay}" in header
    assert f"kustomize edit set image {IMAGE}@sha256:<digest>" in header
    assert f"kubectl delete -k k8s/overlays/{overlay}" in header


# The cluster's own variables: none may leak in from the shell running the tests.
CLUSTER_ENV = re.compile(r"^(PET_|MASTER_|NNODES$|NODE_RANK$|JOB_COMPLETION_INDEX$|WORLD_SIZE$|RANK$|LOCAL_RANK$)")
NODE_CASES = [("single-node", 0), *[(overlay, rank) for overlay in MULTI_NODE for rank in (0, 1)]]


def node_environment(docs: list[dict], rank: int, root: Path) -> dict[str, str]:
    """The pod's environment for node ``rank`` as its controller fills it in, the volumes standing in as directories
    under ``root`` (claims shared by the nodes, emptyDirs per pod)."""
    pod = pod_for_node(docs, rank)
    return relocate(pod.env, mount_paths(pod.template, root / "claims", root / f"pod-{rank}"))


def run_plan(pod_env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLM_") and not CLUSTER_ENV.match(k)}
    # entrypoint.sh runs python3: this environment's.
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    return entrypoint("plan", env={**base, **pod_env}, cwd=REPO, timeout=300)
