"""k8s/components/bucket-outputs and k8s/overlays/multi-node-bucket: outputs in a bucket, no output volume.

Every overlay with the component renders and validates strictly (as tests/e2e/test_k8s.py checks the overlays
themselves), has no output claim, volume or mount, writes MLM_OUTPUT_DIR=s3://... through MLM_STAGING_DIR on a
per-pod volume, reads the store's credentials only as files from the Secret, and changes nothing else. The
component's two pod patches (the shared PodTemplate, a built Job) make the same pod; an overlay on top of a custom
resource's overlay fails to build instead of rendering a broken pod. The launcher's plan, which looks into the
store, runs for every node against a local S3-compatible server (moto's): each node stages into its own volume and
would resume from the bucket's newest complete checkpoint; through ./entrypoint.sh the credentials come from the
Secret's files, and a wrong secret there is refused.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.e2e.k8s_manifests import (
    K8S,
    KUBERNETES_VERSION,
    MULTI_NODE,
    NODE_CASES,
    OVERLAYS,
    as_pod_templates,
    assert_header_says_how_to_run_it,
    container,
    find,
    is_custom,
    kubectl,
    node_environment,
    nodes,
    pod_templates,
    render,
    run_plan,
    schema_errors,
    validate,
    workload,
)
from train.common.errors import EXIT_ENVIRONMENT
from train.config import NON_OPTION_ENV, load_config
from train.outputs.runfiles import COMPLETE_MARKER

COMPONENT = "bucket-outputs"
EXAMPLE = "multi-node-bucket"  # the ready overlay: multi-node-indexed with the component
BASED_ON = {EXAMPLE: "multi-node-indexed"}
OUTPUT_CLAIM = "mlm-trainer-output"
SECRET = "mlm-trainer-s3"
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
BUCKET = "mlm-trainer"
RESUMABLE_STEP = 40  # a complete checkpoint the tests put in the bucket
# Overlays whose pod sits in a custom resource once built: the component cannot be added on top of them.
CUSTOM_WORKLOADS = ("jobset", "trainjob", "multi-node-pytorchjob")


def k8s_copy(
    root: Path, add_to: tuple[str, ...] = (), on_top_of: str | None = None, components: tuple[str, ...] = (COMPONENT,)
) -> Path:
    """A copy of k8s/ with ``components`` added to the kustomization of each overlay in ``add_to`` (the documented
    edit), and with ``on_top_of``: an overlay ``on-<that>`` that has it as its one resource and adds the component."""
    copied = root / "k8s"
    shutil.copytree(K8S, copied)
    for overlay in add_to:
        path = copied / "overlays" / overlay / "kustomization.yaml"
        kustomization = yaml.safe_load(path.read_text())
        kustomization.setdefault("components", []).extend(f"../../components/{c}" for c in components)
        path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    if on_top_of:
        (copied / "overlays" / f"on-{on_top_of}").mkdir()
        (copied / "overlays" / f"on-{on_top_of}" / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [f"../{on_top_of}"],
                    "components": [f"../../components/{COMPONENT}"],
                }
            )
        )
    return copied


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Each overlay with the component added to it, and the ready example as it is."""
    copied = k8s_copy(tmp_path_factory.mktemp("k8s"), add_to=OVERLAYS)
    return {**{overlay: render(overlay, copied) for overlay in OVERLAYS}, EXAMPLE: render(EXAMPLE)}


def env_of(template: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container(template).get("env", [])}


def mounted_volume(template: dict, path: str) -> tuple[dict, dict]:
    """(mount, volume) of the mount holding ``path`` (the deepest mount path it is under)."""
    mounts = [
        m for m in container(template).get("volumeMounts", []) if PurePosixPath(path).is_relative_to(m["mountPath"])
    ]
    assert mounts, f"{path} is on no volume (the root filesystem is read-only)"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    return mount, volumes[mount["name"]]


def output_problems(docs: list[dict]) -> list[str]:
    """What still ties the overlay to an output volume, or keeps its outputs out of the bucket."""
    problems = [f"PersistentVolumeClaim {OUTPUT_CLAIM}" for d in docs if d["metadata"]["name"] == OUTPUT_CLAIM]
    for role, template in pod_templates(docs).items():
        for volume in template["spec"]["volumes"]:
            if volume.get("persistentVolumeClaim", {}).get("claimName") == OUTPUT_CLAIM or volume["name"] == "output":
                problems.append(f"{role}: volume {volume['name']}")
        problems += [
            f"{role}: mount at /output" for m in container(template)["volumeMounts"] if m["mountPath"] == "/output"
        ]
        env = env_of(template)
        output_dir = env.get("MLM_OUTPUT_DIR", {}).get("value", "")
        if not output_dir.startswith("s3://") or len(output_dir) <= len("s3://"):
            problems.append(f"{role}: MLM_OUTPUT_DIR={output_dir!r} is not an s3:// URL")
        staging = env.get("MLM_STAGING_DIR", {}).get("value")
        if not staging:
            problems.append(f"{role}: no MLM_STAGING_DIR")
            continue
        mount, volume = mounted_volume(template, staging)
        if mount.get("readOnly") or "emptyDir" not in volume or "sizeLimit" not in volume["emptyDir"]:
            problems.append(f"{role}: MLM_STAGING_DIR={staging} is not on a writable emptyDir with a sizeLimit")
    return problems


def credential_problems(template: dict) -> list[str]:
    """The store's credentials must come only as files of the Secret (``*_FILE``), never as values."""
    box = container(template)
    problems = []
    for ref in box.get("envFrom", []):
        if "configMapRef" not in ref or not ref["configMapRef"].get("optional"):
            problems.append(f"envFrom {ref}: only an optional ConfigMap (the store's settings)")
    env = env_of(template)
    problems += [f"{name} set in the manifest" for name in CREDENTIALS if name in env]
    for name in ("AWS_ACCESS_KEY_ID_FILE", "AWS_SECRET_ACCESS_KEY_FILE"):
        if "value" not in env.get(name, {}):
            problems.append(f"no {name}")
            continue
        mount, volume = mounted_volume(template, env[name]["value"])
        secret = volume.get("secret", {})
        if secret.get("secretName") != SECRET or not mount.get("readOnly") or secret.get("defaultMode") != 0o400:
            problems.append(f"{name}: not a file of the Secret {SECRET}, read-only, mode 0400")
    return problems


def same_pod_but_outputs(docs: list[dict]) -> list[dict]:
    """The documents with each pod template's output settings taken out (the claim, its volume and mount, the
    store's variables and volumes), the env, mounts and volumes keyed by name, so that order does not count."""
    docs = copy.deepcopy([d for d in docs if d["metadata"]["name"] != OUTPUT_CLAIM])
    for template in pod_templates(docs).values():
        box = container(template)
        env = env_of(template)
        staging, secrets = env.get("MLM_STAGING_DIR"), env.get("AWS_ACCESS_KEY_ID_FILE")
        drop = {"/output"} | {mounted_volume(template, e["value"])[0]["mountPath"] for e in (staging, secrets) if e}
        dropped = {m["name"] for m in box["volumeMounts"] if m["mountPath"] in drop}
        box["env"] = {
            n: e for n, e in env.items() if n != "MLM_OUTPUT_DIR" and not n.startswith(("MLM_STAGING", "AWS_"))
        }
        box.pop("envFrom", None)
        box["volumeMounts"] = {m["mountPath"]: m for m in box["volumeMounts"] if m["mountPath"] not in drop}
        template["spec"]["volumes"] = {v["name"]: v for v in template["spec"]["volumes"] if v["name"] not in dropped}
    return docs


# --- rendering and schema -------------------------------------------------------------------------------------------


def test_every_overlay_with_the_component_validates_strictly(bucketed, tmp_path):
    """Kubernetes' kinds and each pod template (as a PodTemplateSpec) in one kubernetes-validate --strict run;
    the custom resources against their CRDs' schemas."""
    checked = []
    for docs in bucketed.values():
        checked += [d for d in docs if not is_custom(d)] + as_pod_templates(docs)
        for doc in filter(is_custom, docs):
            assert schema_errors(doc, KUBERNETES_VERSION) == [], doc["kind"]
    done = validate(checked, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" passed for resource ") == len(checked), done.stdout


def test_no_output_volume_and_outputs_in_the_bucket(bucketed, rendered):
    for overlay, docs in bucketed.items():
        assert output_problems(docs) == [], overlay
    # The check can fail: each overlay as it is uses the output claim.
    for overlay, docs in rendered.items():
        assert f"PersistentVolumeClaim {OUTPUT_CLAIM}" in output_problems(docs), overlay
        assert any("mount at /output" in p for p in output_problems(docs)), overlay


def test_staging_is_a_per_pod_volume_not_the_shared_cache(bucketed):
    """Every node downloads the checkpoint it resumes from into its own staging directory: on the multi-node
    overlays the cache claim (the default staging place, under HF_HOME) is one directory for all nodes."""
    for overlay, docs in bucketed.items():
        for role, template in pod_templates(docs).items():
            env = {n: e.get("value") for n, e in env_of(template).items()}
            _, volume = mounted_volume(template, env["MLM_STAGING_DIR"])
            assert "persistentVolumeClaim" not in volume, f"{overlay}/{role}"
            assert not PurePosixPath(env["MLM_STAGING_DIR"]).is_relative_to(env["HF_HOME"]), f"{overlay}/{role}"


def test_credentials_are_files_of_the_secret(bucketed):
    for overlay, docs in bucketed.items():
        for role, template in pod_templates(docs).items():
            assert credential_problems(template) == [], f"{overlay}/{role}"
        # The Secret is made by hand (kubectl create secret): no credentials in the manifests.
        assert not [d for d in docs if d["kind"] == "Secret"], overlay
    # The check can fail: a key as a value, a Secret as environment, a file outside the Secret.
    template = copy.deepcopy(pod_templates(bucketed[EXAMPLE])["Job"])
    container(template)["env"].append({"name": "AWS_SECRET_ACCESS_KEY", "value": "x"})
    container(template)["envFrom"].append({"secretRef": {"name": SECRET}})
    for entry in container(template)["env"]:
        if entry["name"] == "AWS_ACCESS_KEY_ID_FILE":
            entry["value"] = "/tmp/access-key-id"
    assert len(credential_problems(template)) == 3, credential_problems(template)


def test_only_the_outputs_change(bucketed, rendered):
    """Everything but the outputs is the overlay as it was: the other claims, access modes, resources, security,
    the workload and its failure handling."""
    for overlay, docs in bucketed.items():
        assert same_pod_but_outputs(docs) == same_pod_but_outputs(rendered[BASED_ON.get(overlay, overlay)]), overlay
    for overlay in MULTI_NODE:
        for name in ("mlm-trainer-cache", "mlm-trainer-data"):
            assert find(bucketed[overlay], "PersistentVolumeClaim", name)["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_two_pod_patches_make_the_same_pod(tmp_path):
    """Added to single-node, the component changes the shared PodTemplate; on top of single-node, the built Job: the
    same pod. Added twice (to single-node and to the example on top of it), it changes nothing more."""
    added = k8s_copy(tmp_path / "added", add_to=("single-node",))
    on_top = k8s_copy(tmp_path / "on-top", on_top_of="single-node")
    assert render("on-single-node", on_top) == render("single-node", added)
    twice, once = render(EXAMPLE, added), render(EXAMPLE)
    assert same_pod_but_outputs(twice) == same_pod_but_outputs(once)
    assert env_of(pod_templates(twice)["Job"]) == env_of(pod_templates(once)["Job"])
    assert output_problems(twice) == []


@pytest.mark.parametrize("overlay", ["jobset", "multi-node-indexed"])
def test_with_kueue_in_either_order(overlay, tmp_path):
    """components/kueue touches the workload's metadata and suspend flag only: listed before or after this
    component, the result is the same, queued and with its outputs in the bucket."""
    first = render(overlay, k8s_copy(tmp_path / "a", add_to=(overlay,), components=("kueue", COMPONENT)))
    second = render(overlay, k8s_copy(tmp_path / "b", add_to=(overlay,), components=(COMPONENT, "kueue")))
    assert first == second
    assert workload(first)["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "user-queue"
    assert output_problems(first) == []


@pytest.mark.parametrize("overlay", CUSTOM_WORKLOADS)
def test_on_top_of_a_custom_resource_overlay_the_build_fails(overlay, tmp_path):
    """kustomize's strategic merge replaces the lists of a custom resource whole: rather than render a pod that
    still mounts the output claim, the component's guard stops the build (it belongs in that overlay itself)."""
    copied = k8s_copy(tmp_path, on_top_of=overlay)
    done = subprocess.run(
        [kubectl(), "kustomize", str(copied / "overlays" / f"on-{overlay}")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "components/bucket-outputs" in done.stderr and "testing value /spec/" in done.stderr, done.stderr


def test_the_example_overlay_header_says_how_to_run_it():
    assert_header_says_how_to_run_it(EXAMPLE)  # pin, apply, watch, logs, clean up
    text = (K8S / "overlays" / EXAMPLE / "kustomization.yaml").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert f"kubectl create secret generic {SECRET}" in header
    assert "access-key-id=" in header and "secret-access-key=" in header


# --- the configuration and the plan of each node --------------------------------------------------------------------


def test_environment_is_a_valid_configuration(bucketed):
    """The options as the job reads them: the bucket is the output store, the staging volume its local copy."""
    for overlay, docs in bucketed.items():
        for role, template in pod_templates(docs).items():
            env = {
                n: e["value"] for n, e in env_of(template).items() if n.startswith("MLM_") and n not in NON_OPTION_ENV
            }
            config = load_config([], env)
            assert config.output_store == env["MLM_OUTPUT_DIR"], f"{overlay}/{role}"
            assert config.training.output_dir == env["MLM_STAGING_DIR"], f"{overlay}/{role}"


@pytest.fixture(scope="module")
def store(authenticating) -> dict[str, str]:
    """The store's settings (the optional ConfigMap mlm-trainer-s3) and credentials (the Secret's keys) for the moto
    server, and the bucket holding a complete checkpoint and an incomplete newer one."""
    import boto3

    url, key_id, secret = authenticating
    settings = {
        "AWS_ENDPOINT_URL": url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_CONFIG_FILE": "/nonexistent",
    }
    s3 = boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key_id, aws_secret_access_key=secret
    )
    s3.create_bucket(Bucket=BUCKET)
    prefix = "runs/mlm-trainer"
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/checkpoint-{RESUMABLE_STEP}/trainer_state.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/checkpoint-{RESUMABLE_STEP}/{COMPLETE_MARKER}", Body=b"done\n")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/checkpoint-{RESUMABLE_STEP + 10}/trainer_state.json", Body=b"{}")
    return {**settings, "access-key-id": key_id, "secret-access-key": secret}


def store_env(store: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in store.items() if k.startswith("AWS_")}


@pytest.mark.parametrize(("overlay", "rank"), NODE_CASES)
def test_plan_for_each_node_stages_locally_and_resumes_from_the_bucket(
    bucketed, store, overlay, rank, tmp_path, monkeypatch, capsys
):
    """The plan on an 8-GPU node (NVML faked) with the credentials in the environment, as the entrypoint leaves
    them: the store is reachable, the node stages in its own volume, and would resume from the bucket's newest
    complete checkpoint (its own download of it)."""
    from tests.fakes import h100s, install
    from train.launch import __main__ as launcher

    install(monkeypatch, h100s(8))
    monkeypatch.setattr(launcher, "torch_cuda_version", lambda: "12.4")
    env = node_environment(bucketed[overlay], rank, tmp_path)
    for name, value in store_env(store).items():
        monkeypatch.setenv(name, value)  # botocore reads the process's environment
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", store["access-key-id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store["secret-access-key"])
    assert launcher.main(["plan"], env) == 0
    plan = json.loads(capsys.readouterr().out)
    facts = plan["output_dir"]
    assert facts["store"] == "s3://mlm-trainer/runs/mlm-trainer"
    assert facts["staging_dir"] == env["MLM_STAGING_DIR"]
    assert Path(facts["staging_dir"]).is_relative_to(tmp_path / f"pod-{rank}")  # this pod's emptyDir
    assert f"checkpoint-{RESUMABLE_STEP}" in facts["a run would"]
    assert plan["node_rank"] == rank and plan["world_size"] == 8 * nodes(bucketed[overlay])


@pytest.mark.slow
def test_entrypoint_reads_the_credentials_from_the_secrets_files(bucketed, store, tmp_path, monkeypatch):
    """./entrypoint.sh plan on the example's node 1, the Secret's keys as files where the pod mounts them: the store
    takes them; a wrong secret key in the file is refused (exit 3) without being shown."""
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)  # the caller's own: the entrypoint refuses a value and its file
    docs = bucketed[EXAMPLE]
    for secret, code in ((store["secret-access-key"], 0), ("wrong-secret-canary", EXIT_ENVIRONMENT)):
        root = tmp_path / str(code)
        env = {**node_environment(docs, 1, root), **store_env(store), "MLM_REQUIRE_GPU": "false"}
        Path(env["AWS_ACCESS_KEY_ID_FILE"]).write_text(store["access-key-id"] + "\n")
        Path(env["AWS_SECRET_ACCESS_KEY_FILE"]).write_text(secret + "\n")
        done = run_plan(env)
        assert done.returncode == code, done.stderr[-3000:]
        assert secret not in done.stdout + done.stderr
    assert "refused" in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
