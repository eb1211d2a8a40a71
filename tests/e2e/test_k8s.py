"""The Kubernetes manifests (k8s/): every overlay renders with kustomize, validates strictly against a current
Kubernetes (custom resources against their CRDs' published schemas, k8s/schemas/), keeps the pod contract of
issue 5 (restricted security, volumes, secrets, exit codes, labels, image by digest), maps the exit codes onto each
controller's failure handling (Job podFailurePolicy, JobSet failurePolicy), can be queued through Kueue, and gives
the launcher an environment that it turns into the right torchrun command on node 0 and node 1.
Offline: kubectl kustomize, kubernetes-validate and jsonschema need no cluster.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.e2e.k8s_manifests import (
    CUSTOM_RESOURCES,
    IMAGE,
    K8S,
    KUBERNETES_VERSION,
    NODE_CASES,
    OVERLAYS,
    SHARED_CLAIMS,
    TRAINER_ANCESTOR_LABEL,
    TRAINER_NODE,
    WORKLOAD_KINDS,
    as_pod_templates,
    assert_header_says_how_to_run_it,
    container,
    find,
    is_custom,
    jobset_spec,
    node_environment,
    nodes,
    pod_for_node,
    pod_templates,
    render,
    run_plan,
    runtime_of,
    schema_errors,
    trainer_replicated_job,
    validate,
    workload,
)
from train.common.errors import EXIT_CONFIG, EXIT_ENVIRONMENT, EXIT_HUNG, EXIT_PREEMPTED
from train.config import NON_OPTION_ENV, load_config

# The downstream evaluation's Job: every checkpoint of the run on the output claim, on the task on the data claim.
FINETUNE_ARGS = [
    "finetune",
    "--task",
    "/data/task",
    "--task_all_checkpoints",
    "true",
    "--model_name_or_path",
    "/output",
]
# The decay branches' Indexed Job: pod i branches from the run's checkpoint with branch-i.yaml into its directory.
BRANCH_ARGS = [
    "branch",
    "/output/checkpoint-800",
    "--config",
    "/branches/branch-$(BRANCH_INDEX).yaml",
    "--output_dir",
    "/output/branches/$(BRANCH_INDEX)",
]
BRANCHES = K8S / "overlays" / "branches"
DIGEST = re.compile(r"^" + re.escape(IMAGE) + r"@sha256:[0-9a-f]{64}$")
LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/component",
)


# --- rendering and schema -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_strictly(rendered, overlay, tmp_path):
    done = validate(rendered[overlay], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ERROR" not in done.stdout
    # Everything but the custom resources (next test) is checked against the bundled schemas.
    checked = [d for d in rendered[overlay] if not is_custom(d)]
    assert done.stdout.count(" passed for resource ") == len(checked), done.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_validate_against_their_crd_schemas(rendered, overlay):
    """TrainJob, TrainingRuntime, JobSet and PyTorchJob against the schemas their CRDs publish (k8s/schemas/),
    strictly: an unknown field is an error, as `kubectl apply` makes it."""
    custom = [d for d in rendered[overlay] if is_custom(d)]
    for doc in custom:
        assert (doc["apiVersion"], doc["kind"]) in CUSTOM_RESOURCES, f"no vendored schema for {doc['kind']}"
        assert schema_errors(doc, KUBERNETES_VERSION) == []
    if workload(rendered[overlay])["kind"] != "Job":
        assert custom, overlay


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda job: job["spec"]["trainer"].update(numNode=2), "'numNode' was unexpected"),
        (lambda job: job["spec"]["trainer"].update(numProcPerNode="auto"), "'auto' is not of type 'integer'"),
        (lambda job: job["spec"].pop("runtimeRef"), "'runtimeRef' is a required property"),
        (lambda job: job["metadata"].update(label={"a": "b"}), "'label' was unexpected"),
    ],
    ids=["misspelt-field", "wrong-type", "missing-required", "misspelt-metadata"],
)
def test_schema_validation_rejects_a_broken_trainjob(rendered, change, error):
    """The validation above can fail: each deliberate violation of the TrainJob CRD's schema is reported."""
    broken = copy.deepcopy(find(rendered["trainjob"], "TrainJob"))
    change(broken)
    errors = schema_errors(broken, KUBERNETES_VERSION)
    assert len(errors) == 1 and error in errors[0], errors


def test_schema_validation_rejects_a_broken_pod_in_a_jobset(rendered):
    """The pod template inside a JobSet is checked against the CRD's copy of PodTemplateSpec, strictly."""
    broken = copy.deepcopy(workload(rendered["jobset"]))
    pod = broken["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    broken["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartJobset"
    errors = "\n".join(schema_errors(broken, KUBERNETES_VERSION))
    assert errors.count("\n") == 1, errors
    assert "containers.0.securityContext: Additional properties are not allowed ('readOnlyRootFileSystem'" in errors
    assert "failurePolicy.rules.0.action: 'RestartJobset' is not one of" in errors


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_templates_validate_as_podtemplatespec(rendered, overlay, tmp_path):
    """The validator only warns on a PyTorchJob; its Master and Worker templates are checked here as PodTemplateSpec."""
    wrapped = as_pod_templates(rendered[overlay])
    done = validate(wrapped, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" passed for resource podtemplate/") == len(wrapped), done.stdout


def test_strict_validation_rejects_a_misspelt_field(rendered, tmp_path):
    """The validation above can fail: a misspelt field in a pod template is an error."""
    wrapped = as_pod_templates(rendered["multi-node-pytorchjob"])
    broken = copy.deepcopy(wrapped[0])
    broken["template"]["spec"]["terminationGracePeriodSecond"] = 300
    done = validate([broken], tmp_path)
    assert done.returncode != 0
    assert "terminationGracePeriodSecond" in done.stdout


def test_the_shared_pod_template_is_not_applied(rendered):
    """base/pod-template.yaml is copied into the workloads, then dropped from the output."""
    for overlay, docs in rendered.items():
        assert not [d for d in docs if d["kind"] == "PodTemplate"], overlay


# --- the pod contract -----------------------------------------------------------------------------------------------


def templates_of(rendered):
    for overlay in OVERLAYS:
        for role, template in pod_templates(rendered[overlay]).items():
            yield overlay, role, template


def test_restricted_security_context(rendered):
    for overlay, role, template in templates_of(rendered):
        where = f"{overlay}/{role}"
        pod = template["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True, where
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is False, where
        assert "hostNetwork" not in pod and "hostIPC" not in pod and "hostPID" not in pod, where
        box = container(template)["securityContext"]
        assert box["allowPrivilegeEscalation"] is False, where
        assert box["readOnlyRootFilesystem"] is True, where
        assert box["capabilities"] == {"drop": ["ALL"]}, where
        assert "privileged" not in box, where


def volume_at(template: dict, mount_path: str) -> dict:
    mounts = {m["mountPath"]: m for m in container(template)["volumeMounts"]}
    assert mount_path in mounts, f"nothing mounted at {mount_path}"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    return {**volumes[mounts[mount_path]["name"]], "readOnly": mounts[mount_path].get("readOnly", False)}


def test_volumes(rendered):
    for overlay, role, template in templates_of(rendered):
        where = f"{overlay}/{role}"
        docs = rendered[overlay]
        # NCCL and DataLoader workers need more than a container's default 64 MiB of /dev/shm.
        assert volume_at(template, "/dev/shm")["emptyDir"]["medium"] == "Memory", where
        # The root filesystem is read-only: /tmp is the writable scratch space.
        assert "emptyDir" in volume_at(template, "/tmp"), where
        want_mode = "ReadWriteMany" if overlay in SHARED_CLAIMS else "ReadWriteOnce"
        for path in ("/output", "/cache", "/data"):
            volume = volume_at(template, path)
            claim = find(docs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            assert claim["spec"]["accessModes"] == [want_mode], f"{where}: {path}"
        assert volume_at(template, "/data")["readOnly"] is True, where
        assert volume_at(template, "/output")["readOnly"] is False, where


def test_environment_points_at_the_volumes_and_is_a_valid_configuration(rendered):
    """Every MLM_* variable is a real option with a valid value (the job would stop with exit 2 otherwise)."""
    for overlay, role, template in templates_of(rendered):
        env = {e["name"]: e for e in container(template)["env"]}
        # The image's default MLM_CONFIG is the demo preset (a toy model): a pod must say which options it means.
        assert "MLM_CONFIG" in env and "demo" not in env["MLM_CONFIG"]["value"]
        assert env["MLM_OUTPUT_DIR"]["value"] == "/output"
        assert env["HF_HOME"]["value"].startswith("/cache")
        assert env["MLM_DATASET"]["value"].startswith("/data")
        options = {n: e["value"] for n, e in env.items() if n.startswith("MLM_") and n not in NON_OPTION_ENV}
        if overlay == "branches":  # every branch's options file, as pod i reads it: a valid configuration
            for index in (0, 1):
                flags = [a.replace("$(BRANCH_INDEX)", str(index)) for a in container(template)["args"][2:]]
                flags[1] = str(BRANCHES / Path(flags[1]).name)
                config = load_config(flags, options)
                assert config.training.output_dir == f"/output/branches/{index}"
                assert config.training.max_steps > 800  # past the branch point
            continue
        config = load_config(container(template)["args"][1:], options)  # the command's flags after its name
        assert config.training.output_dir == "/output", f"{overlay}/{role}"
        if overlay == "finetune-checkpoints":  # the run on the output claim, every checkpoint of it
            assert config.task.task_all_checkpoints and config.model.model_name_or_path == "/output"


def test_service_links_are_off(rendered):
    """Service links would inject MLM_<SERVICE>_PORT... for a Service named mlm-*: unknown options, exit 2."""
    for overlay, role, template in templates_of(rendered):
        assert template["spec"]["enableServiceLinks"] is False, f"{overlay}/{role}"


def test_hf_token_comes_from_a_secret(rendered):
    for overlay, role, template in templates_of(rendered):
        env = {e["name"]: e for e in container(template)["env"]}
        if "HF_TOKEN" in env:
            ref = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref["name"] and ref["key"], f"{overlay}/{role}"
            assert "value" not in env["HF_TOKEN"]
        else:
            assert "HF_TOKEN_FILE" in env, f"{overlay}/{role}: HF_TOKEN from a Secret, as env or file"


def test_grace_period_leaves_time_for_a_checkpoint(rendered):
    for overlay, role, template in templates_of(rendered):
        grace = template["spec"]["terminationGracePeriodSeconds"]
        assert grace >= 120, f"{overlay}/{role}"
        # The ranks' time to save after SIGTERM, with 30 s left for the launcher to relay and exit.
        env = {e["name"]: e.get("value") for e in container(template)["env"]}
        assert int(env["MLM_STOP_TIMEOUT"]) + 30 <= grace, f"{overlay}/{role}"


def test_the_image_entrypoint_stays(rendered):
    """Every container sets args, never command: tini (PID 1) and entrypoint.sh keep running the launcher. A TrainJob
    may override the runtime's command, so it must not either."""
    for overlay, role, template in templates_of(rendered):
        box = container(template)
        command = {"finetune-checkpoints": FINETUNE_ARGS, "branches": BRANCH_ARGS}.get(overlay, ["train"])
        assert "command" not in box and box["args"] == command, f"{overlay}/{role}"
    assert "command" not in workload(rendered["trainjob"])["spec"].get("trainer", {})


def test_gpus_are_requested(rendered):
    for overlay, role, template in templates_of(rendered):
        limits = container(template)["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1, f"{overlay}/{role}"


def test_image_is_pinned_by_digest(rendered):
    for overlay, role, template in templates_of(rendered):
        assert DIGEST.match(container(template)["image"]), f"{overlay}/{role}: {container(template)['image']}"


def test_labels(rendered):
    for overlay, docs in rendered.items():
        for doc in docs:
            labels = doc["metadata"].get("labels", {})
            for key in LABELS:
                assert labels.get(key), f"{overlay}: {doc['kind']}/{doc['metadata']['name']} lacks {key}"
    for overlay, role, template in templates_of(rendered):
        labels = template["metadata"]["labels"]
        for key in LABELS:
            assert labels.get(key), f"{overlay}/{role} pod template lacks {key}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_header_says_how_to_run_it(overlay):
    """Each overlay starts with the commands to pin the image, apply, watch, read logs and clean up."""
    assert_header_says_how_to_run_it(overlay)


# --- failure handling -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["single-node", "multi-node-indexed"])
def test_pod_failure_policy_uses_the_documented_exit_codes(rendered, overlay):
    job = workload(rendered[overlay])
    assert job["kind"] == "Job"
    name = container(job["spec"]["template"])["name"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # required by podFailurePolicy
    actions: dict[object, str] = {}
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            assert codes["containerName"] == name and codes["operator"] == "In"
            actions.update({code: rule["action"] for code in codes["values"]})
        for condition in rule.get("onPodConditions", []):
            actions[(condition["type"], condition.get("status", "True"))] = rule["action"]
    assert actions == {
        EXIT_CONFIG: "FailJob",
        EXIT_ENVIRONMENT: "FailJob",
        EXIT_PREEMPTED: "Ignore",
        EXIT_HUNG: "Count",
        ("DisruptionTarget", "True"): "Ignore",
    }
    # A replacement pod starts only once the failed one is gone (never two pods of one node at once).
    assert job["spec"]["podReplacementPolicy"] == "Failed"


# The Kubernetes Job controller's failure message for a pod matching a FailJob rule (pkg/controller/job/
# pod_failure_policy.go, matchPodFailurePolicy), with the Job failure reasons of batch/v1 (JobReasonPodFailurePolicy,
# JobReasonBackoffLimitExceeded): what a JobSet's failurePolicy rules match on.
def job_failure(job_spec: dict, container_name: str, exit_code: int, condition: str | None = None):
    """(reason, message) of the Job once this pod failed, or None when the Job goes on (an Ignore rule, or failures
    left under backoffLimit)."""
    pod = "default/mlm-trainer-node-0-1-x7k2p"
    for index, rule in enumerate(job_spec.get("podFailurePolicy", {}).get("rules", [])):
        if "onExitCodes" in rule:
            req = rule["onExitCodes"]
            if req.get("containerName", container_name) != container_name or exit_code == 0:
                continue
            if (exit_code in req["values"]) != (req["operator"] == "In"):
                continue
            found = f"Container {container_name} for pod {pod} failed with exit code {exit_code}"
        else:
            wanted = {(c["type"], c.get("status", "True")) for c in rule["onPodConditions"]}
            if condition is None or (condition, "True") not in wanted:
                continue
            found = f"Pod {pod} has condition {condition}"
        if rule["action"] == "Ignore":
            return None
        if rule["action"] == "FailJob":
            return "PodFailurePolicy", f"{found} matching FailJob rule at index {index}"
        break  # Count: an ordinary failure
    if job_spec.get("backoffLimit", 6) == 0:
        return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    return None


def jobset_action(spec: dict, replicated_job: str, reason: str, message: str) -> str:
    """The JobSet controller's choice for a failed child Job (kubernetes-sigs/jobset v0.12.0
    pkg/controllers/failure_policy.go: the first rule whose reasons, message patterns (RE2, unanchored search) and
    target replicated Jobs all match; RestartJobSet when none does)."""
    for rule in spec["failurePolicy"].get("rules", []):
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns", [])
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        if rule.get("targetReplicatedJobs") and replicated_job not in rule["targetReplicatedJobs"]:
            continue
        return rule["action"]
    return "RestartJobSet"


@pytest.mark.parametrize("overlay", ["jobset", "trainjob"])
def test_jobset_failure_policy_uses_the_documented_exit_codes(rendered, overlay):
    """Each exit code (README, "Exit codes") through the Job's podFailurePolicy and the JobSet's failurePolicy."""
    spec = jobset_spec(rendered[overlay])
    replicated = trainer_replicated_job(rendered[overlay])
    job = replicated["template"]["spec"]
    name = container(job["template"])["name"]
    assert job["template"]["spec"]["restartPolicy"] == "Never"  # required by podFailurePolicy

    def action(exit_code: int, condition: str | None = None) -> str:
        failed = job_failure(job, name, exit_code, condition)
        assert failed is not None, f"exit {exit_code}: the Job must fail at once, the JobSet restarts all nodes"
        return jobset_action(spec, replicated["name"], *failed)

    assert action(EXIT_CONFIG) == action(EXIT_ENVIRONMENT) == "FailJobSet"
    # Preempted with a checkpoint, or evicted / node drained or lost: restart every node, not counted.
    assert action(EXIT_PREEMPTED) == "RestartJobSetAndIgnoreMaxRestarts"
    assert action(137, "DisruptionTarget") == action(143, "DisruptionTarget") == "RestartJobSetAndIgnoreMaxRestarts"
    # A crash, torchrun's 1 after losing a peer, the OOM killer, a hung node: counted against maxRestarts.
    assert action(1) == action(137) == action(EXIT_HUNG) == "RestartJobSet"
    assert any(rule["name"] == "Hung" for rule in spec["failurePolicy"]["rules"])
    assert spec["failurePolicy"]["maxRestarts"] >= 1
    # All old pods are gone before the new ones start: never two pods of one node (nor two leases) at once.
    assert spec["failurePolicy"]["restartStrategy"] == "BlockingRecreate"
    # The JobSet webhook's rule-name rule (api/jobset/v1alpha2/jobset_types.go, FailurePolicyRule.Name).
    for rule in spec["failurePolicy"]["rules"]:
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]), rule["name"]


def test_pytorchjob_restarts_failed_pods(rendered):
    job = workload(rendered["multi-node-pytorchjob"])
    for role, spec in job["spec"]["pytorchReplicaSpecs"].items():
        assert spec["restartPolicy"] == "OnFailure", role
    assert job["spec"]["runPolicy"]["backoffLimit"] >= 1


# --- multi-node topology --------------------------------------------------------------------------------------------


def test_indexed_job_topology(rendered):
    docs = rendered["multi-node-indexed"]
    job = find(docs, "Job")
    service = find(docs, "Service")
    template = job["spec"]["template"]
    env = {e["name"]: e.get("value") for e in container(template)["env"]}
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["NNODES"]) >= 2
    # Node 0's DNS name through the headless Service.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert template["spec"]["subdomain"] == service["metadata"]["name"]
    assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    ports = {p["containerPort"] for p in container(template)["ports"]}
    assert int(env["MASTER_PORT"]) in ports
    assert int(env["MASTER_PORT"]) in {p["port"] for p in service["spec"]["ports"]}


def test_jobset_topology(rendered):
    docs = rendered["jobset"]
    jobset = workload(docs)
    replicated = trainer_replicated_job(docs)
    template = replicated["template"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in container(template)["env"]}
    network = jobset["spec"]["network"]
    assert network["enableDNSHostnames"] is True and network["publishNotReadyAddresses"] is True
    assert replicated["replicas"] == 1
    job = replicated["template"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == int(env["NNODES"]) >= 2
    # Node 0's host name: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain, the JobSet's name by default>.
    subdomain = network.get("subdomain", jobset["metadata"]["name"])
    assert env["MASTER_ADDR"] == f"{jobset['metadata']['name']}-{replicated['name']}-0-0.{subdomain}"
    assert int(env["MASTER_PORT"]) in {p["containerPort"] for p in container(template)["ports"]}
    assert not [d for d in docs if d["kind"] == "Service"]  # the JobSet controller creates the headless Service


def test_trainjob_shape(rendered):
    """What Kubeflow Trainer v2 relies on, beyond the CRD schema: the runtime is in the overlay, the trainer's
    replicated Job carries the ancestor label, its container is named node, no reserved PET_* is set by hand, and
    the CEL rule on the name (RFC 1035 label, 63 characters at most)."""
    docs = rendered["trainjob"]
    trainjob = workload(docs)
    runtime = runtime_of(docs, trainjob)
    assert runtime["kind"] == "TrainingRuntime"
    assert trainjob["spec"]["runtimeRef"]["apiGroup"] == "trainer.kubeflow.org"
    assert "torch" in runtime["spec"]["mlPolicy"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", trainjob["metadata"]["name"])
    assert len(trainjob["metadata"]["name"]) <= 63
    replicated = trainer_replicated_job(docs)
    assert replicated["name"] == TRAINER_NODE
    assert replicated["replicas"] == 1  # Trainer's TrainingRuntime webhook (pkg/webhooks/trainingruntime_webhook.go)
    assert replicated["template"]["metadata"]["labels"][TRAINER_ANCESTOR_LABEL] == "trainer"
    assert replicated["template"]["spec"]["completionMode"] == "Indexed"  # PET_NODE_RANK is the completion index
    box = container(pod_templates(docs)[TRAINER_NODE])
    assert box["name"] == TRAINER_NODE
    reserved = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    assert not reserved & {e["name"] for e in box["env"]}
    assert not reserved & {e["name"] for e in trainjob["spec"]["trainer"].get("env", [])}
    # The torch plugin hands out PET_NPROC_PER_NODE=auto only when the node asks for GPUs.
    assert int(box["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    # The JobSet the controller creates carries the runtime template's labels (the headers' watch commands use them).
    jobset_labels = runtime["spec"]["template"]["metadata"]["labels"]
    assert all(jobset_labels.get(key) for key in LABELS), jobset_labels
    # The TrainJob's webhook needs the runtime to exist first: it comes before the TrainJob in the output.
    kinds = [d["kind"] for d in docs]
    assert kinds.index("TrainingRuntime") < kinds.index("TrainJob")


@pytest.mark.parametrize("rank", [0, 1])
def test_trainjob_environment_is_the_torch_plugins(rendered, rank):
    """The PET_* a Trainer v2.3.0 controller gives node 0 and node 1 (k8s_manifests.trainjob_node_env follows
    kubeflow/trainer 658725bd pkg/runtime/framework/plugins/torch/torch.go), and what the launcher reads of it."""
    from train.launch.topology import topology_from_env

    docs = rendered["trainjob"]
    env = pod_for_node(docs, rank).env
    assert {k: v for k, v in env.items() if k.startswith("PET_")} == {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "auto",
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "mlm-trainer-node-0-0.mlm-trainer",
        "PET_MASTER_PORT": "29500",
    }
    assert env["JOB_COMPLETION_INDEX"] == str(rank)
    topology = topology_from_env(env)
    assert (topology.nnodes, topology.node_rank, topology.mode) == ("2", rank, "static")
    assert (topology.master_addr, topology.master_port) == ("mlm-trainer-node-0-0.mlm-trainer", 29500)
    assert topology.nproc_per_node == "auto"
    assert topology.sources == {
        "nnodes": "PET_NNODES",
        "node_rank": "PET_NODE_RANK",
        "master_addr": "PET_MASTER_ADDR",
        "master_port": "PET_MASTER_PORT",
    }


def test_trainjob_progress_reaches_kubeflow_and_tensorboard_stays(rendered, monkeypatch):
    """With Trainer's TrainJobStatus gate on, the controller sets KUBEFLOW_TRAINER_SERVER_URL (and _CA_CERT, _TOKEN);
    transformers' TrainingArguments then appends "kubeflow" to report_to (its KubeflowCallback reports progress to
    the TrainJob's status), after our default TensorBoard, which stays."""
    pod = pod_for_node(rendered["trainjob"], 0, status_server=True)
    for name in ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN"):
        assert name in pod.env
        monkeypatch.setenv(name, pod.env[name])  # transformers reads os.environ
    monkeypatch.delenv("DISABLE_KUBEFLOW_INTEGRATION", raising=False)
    options = {n: v for n, v in pod.env.items() if n.startswith("MLM_") and n not in NON_OPTION_ENV}
    assert load_config([], options).training.report_to == ["tensorboard", "kubeflow"]
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "TRUE")
    assert load_config([], options).training.report_to == ["tensorboard"]


def test_pytorchjob_shape(rendered):
    """The CRD is not in the validator's schemas: the fields the operator relies on are checked here."""
    job = workload(rendered["multi-node-pytorchjob"])
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert set(job["spec"]) <= {"nprocPerNode", "runPolicy", "pytorchReplicaSpecs", "elasticPolicy"}
    assert set(job["spec"]["runPolicy"]) <= {
        "cleanPodPolicy",
        "ttlSecondsAfterFinished",
        "activeDeadlineSeconds",
        "backoffLimit",
        "schedulingPolicy",
        "suspend",
        "managedBy",
    }
    assert job["spec"]["nprocPerNode"] == "auto"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1
    assert replicas["Worker"]["replicas"] >= 1
    for role, spec in replicas.items():
        assert set(spec) <= {"replicas", "restartPolicy", "template"}, role
        # The operator finds the training container and the rendezvous port by these names.
        box = container(spec["template"])
        assert box["name"] == "pytorch", role
        assert "pytorchjob-port" in {p["name"] for p in box["ports"]}, role


# --- the launcher, given each overlay's pod environment --------------------------------------------------------------


def torchrun_options(command: list[str]) -> dict[str, str | None]:
    """torchrun's own options (before ``-m train.run.job``): ``--flag value`` pairs, None for a bare flag."""
    head = command[1 : command.index("-m")]
    options: dict[str, str | None] = {}
    for i, arg in enumerate(head):
        if arg.startswith("--"):
            following = head[i + 1] if i + 1 < len(head) else None
            options[arg] = following if following is not None and not following.startswith("--") else None
    return options


def expected_rendezvous(docs: list[dict]) -> tuple[str, str]:
    """(master address, port) the manifests mean for node 0: the operator's Service, the Indexed Job's DNS name, or
    pod 0 of the JobSet's (or the TrainJob's JobSet's) one Job under its headless Service."""
    job = workload(docs)
    name = job["metadata"]["name"]
    if job["kind"] == "PyTorchJob":
        return f"{name}-master-0", "29500"
    if job["kind"] in ("JobSet", "TrainJob"):
        return f"{name}-{trainer_replicated_job(docs)['name']}-0-0.{name}", "29500"
    return f"{name}-0.{find(docs, 'Service')['metadata']['name']}", "29500"


@pytest.mark.parametrize(("overlay", "rank"), NODE_CASES)
def test_plan_for_each_node(rendered, overlay, rank, tmp_path, monkeypatch, capsys):
    """Each node's plan on a node without a GPU, by the launcher in this process (the pod's environment through
    ./entrypoint.sh: the next test)."""
    from tests.fakes import no_driver
    from train.launch import __main__ as launcher

    no_driver(monkeypatch)
    docs = rendered[overlay]
    env = node_environment(docs, rank, tmp_path)
    # No GPU here: the pods' MLM_REQUIRE_GPU=true would stop the plan (see the next test).
    env["MLM_REQUIRE_GPU"] = "false"
    assert launcher.main(["plan"], env) == 0
    plan = json.loads(capsys.readouterr().out)
    options = torchrun_options(plan["command"])
    count = nodes(docs)
    assert options["--nnodes"] == str(count)
    # nprocPerNode auto / no MLM_NPROC_PER_NODE: one process per GPU, and one on a node without GPU.
    assert options["--nproc-per-node"] == "1"
    assert plan["world_size"] == count
    assert plan["node_rank"] == rank
    assert plan["backend"] == "gloo"
    if overlay == "single-node":
        assert "--standalone" in options
        assert "--node-rank" not in options and "--master-addr" not in options
        return
    master, port = expected_rendezvous(docs)
    assert options["--node-rank"] == str(rank)
    assert (options["--master-addr"], options["--master-port"]) == (master, port)
    assert plan["rendezvous"]["mode"] == "static"
    # MLM_RDZV_TIMEOUT from the overlay bounds how long node 0 waits for the others.
    assert f"timeout={env['MLM_RDZV_TIMEOUT']}" in (options["--rdzv-conf"] or "").split(",")
    wanted_source = {
        "multi-node-pytorchjob": "PET_NODE_RANK",
        "multi-node-indexed": "JOB_COMPLETION_INDEX",
        "jobset": "JOB_COMPLETION_INDEX",
        "trainjob": "PET_NODE_RANK",
    }
    assert plan["topology_sources"]["node_rank"] == wanted_source[overlay]


@pytest.mark.slow
def test_a_gpu_pod_without_a_gpu_stops_with_exit_3(rendered, tmp_path):
    """MLM_REQUIRE_GPU=true in the pods: a node whose GPU is missing fails the Job at once (podFailurePolicy: 3),
    the pod's environment through ./entrypoint.sh as the container runs it."""
    env = node_environment(rendered["multi-node-indexed"], 1, tmp_path)
    done = run_plan(env)
    assert done.returncode == EXIT_ENVIRONMENT, done.stderr[-3000:]
    assert "MLM_REQUIRE_GPU" in done.stderr and "nvidia.com/gpu" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("overlay", "rank"), NODE_CASES)
def test_plan_on_an_eight_gpu_node(rendered, overlay, rank, tmp_path, monkeypatch, capsys):
    """The same environments on a node with 8 GPUs (NVML faked at the pynvml boundary): one rank per GPU, NCCL."""
    from tests.fakes import h100s, install
    from train.launch import __main__ as launcher

    install(monkeypatch, h100s(8))
    monkeypatch.setattr(launcher, "torch_cuda_version", lambda: "12.4")  # the image's CUDA build of torch
    docs = rendered[overlay]
    env = node_environment(docs, rank, tmp_path)
    assert env["MLM_REQUIRE_GPU"] == "true"  # unchanged: the pod as it runs
    assert launcher.main(["plan"], env) == 0
    plan = json.loads(capsys.readouterr().out)
    options = torchrun_options(plan["command"])
    assert options["--nproc-per-node"] == "8"
    assert options["--nnodes"] == str(nodes(docs))
    assert plan["world_size"] == 8 * nodes(docs)
    assert plan["node_rank"] == rank
    assert plan["backend"] == "nccl"
    assert len(plan["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 8
    if overlay != "single-node":
        assert (options["--master-addr"], options["--master-port"]) == expected_rendezvous(docs)
        assert options["--node-rank"] == str(rank)


# --- Kueue ---------------------------------------------------------------------------------------------------------

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Where each workload kind keeps its suspend flag.
SUSPEND = {
    "Job": ("spec", "suspend"),
    "JobSet": ("spec", "suspend"),
    "TrainJob": ("spec", "suspend"),
    "PyTorchJob": ("spec", "runPolicy", "suspend"),
}


def with_component(overlay: str, component: str, root: Path) -> list[dict]:
    """The overlay rendered after the documented edit (`kustomize edit add component ../../components/<name>`),
    made on a copy of k8s/."""
    import shutil

    copy_of_k8s = root / "k8s"
    shutil.copytree(K8S, copy_of_k8s)
    path = copy_of_k8s / "overlays" / overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization.setdefault("components", []).append(f"../../components/{component}")
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return render(overlay, copy_of_k8s)


def dig(doc: dict, path: tuple[str, ...]) -> object:
    for key in path:
        doc = doc.get(key, {})
    return doc


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kueue_component_queues_the_workload(rendered, overlay, tmp_path):
    """With components/kueue the workload names its LocalQueue and is created suspended (Kueue unsuspends it on
    admission); nothing else changes, and the result still matches the CRD schemas."""
    assert set(SUSPEND) == set(WORKLOAD_KINDS)  # a new workload kind needs a rule here and in the component
    queued = with_component(overlay, "kueue", tmp_path)
    job = workload(queued)
    assert job["metadata"]["labels"][QUEUE_LABEL] == "user-queue"
    assert dig(job, SUSPEND[job["kind"]]) is True
    # Only the workload is labelled (not the claims, the Service, the runtime, nor the pods).
    assert [d["kind"] for d in queued if QUEUE_LABEL in d["metadata"].get("labels", {})] == [job["kind"]]
    for template in pod_templates(queued).values():
        assert QUEUE_LABEL not in template["metadata"]["labels"]
    for doc in queued:
        if is_custom(doc):
            assert schema_errors(doc, KUBERNETES_VERSION) == []
    # Everything else is the overlay as it was.
    undone = copy.deepcopy(queued)
    unqueued = workload(undone)
    del unqueued["metadata"]["labels"][QUEUE_LABEL]
    *parents, flag = SUSPEND[unqueued["kind"]]
    del dig(unqueued, tuple(parents))[flag]
    assert undone == rendered[overlay]
