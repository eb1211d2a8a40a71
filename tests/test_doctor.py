"""train.doctor: the CPU path here, GPU paths through a fake NVML (pynvml function boundary) and a faked torch.cuda,
output/cache/shm checks, model and dataset reachability, NCCL result handling and the multi-node master check."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
import torch
from huggingface_hub.errors import RepositoryNotFoundError

from train import doctor
from train.config import load_config
from train.errors import run_main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    """A clean environment: the demo's scratch model and data, output and cache in tmp, no cluster variables."""
    for name in list(__import__("os").environ):
        if name.startswith(("MLM_", "MASTER_", "PET_", "HF_", "CUDA_VISIBLE")) or name in (
            "NODE_RANK",
            "GROUP_RANK",
            "JOB_COMPLETION_INDEX",
            "TRANSFORMERS_OFFLINE",
        ):
            monkeypatch.delenv(name, raising=False)
    values = {
        "MLM_MODEL_NAME_OR_PATH": "scratch:distilbert",
        "MLM_DATASET": "demo",
        "MLM_OUTPUT_DIR": str(tmp_path / "out"),
        "HF_HOME": str(tmp_path / "hf"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def no_nvml(monkeypatch) -> None:
    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


def fake_nvml(monkeypatch, count: int = 2, cuda: int = 12040, driver: str = "550.54.15") -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: driver)
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", lambda: cuda)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: count)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(total=80 * 1024**3))


def fake_torch(monkeypatch, cuda: str | None = "12.4", count: int = 2, probe: str | None = None) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "init", lambda: (_ for _ in ()).throw(RuntimeError("driver too old")))
    monkeypatch.setattr(doctor, "probe_devices", lambda n: probe)


def fast_nccl(monkeypatch, busbw: float = 150.0) -> list[int]:
    calls: list[int] = []

    def run(world: int) -> dict[str, float]:
        calls.append(world)
        return {"seconds": 0.01, "algbw_gbps": busbw, "busbw_gbps": busbw}

    monkeypatch.setattr(doctor, "nccl_allreduce", run)
    return calls


def checks(monkeypatch=None, **torch_fake) -> dict[str, doctor.Check]:
    """Run every check; ``torch_fake`` (see fake_torch) is applied after the configuration is loaded, because
    TrainingArguments itself would act on a torch.cuda that claims GPUs."""
    import os

    config = load_config([])
    if torch_fake:
        fake_torch(monkeypatch, **torch_fake)
    return {c.name: c for c in doctor.run_checks(config, os.environ)}


# ---- the whole command -------------------------------------------------------------------------------------------


def test_cpu_machine_passes_with_a_warning(env, monkeypatch, capsys):
    no_nvml(monkeypatch)
    assert run_main(doctor.main, []) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["CHECK", "STATUS", "DETAIL"]
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if line and not line.startswith(" ")}
    assert rows["gpus"] == "WARN" and rows["driver"] == "SKIP" and rows["nccl"] == "SKIP"
    assert rows["output_dir"] == "OK" and rows["model"] == "OK" and rows["dataset"] == "OK"
    assert "fix: give the container the GPUs" in out and "Nothing blocks the job (1 WARN)" in out


def test_require_gpu_on_a_cpu_machine_fails_with_exit_3(env, monkeypatch, capsys):
    no_nvml(monkeypatch)
    monkeypatch.setenv("MLM_REQUIRE_GPU", "true")
    assert run_main(doctor.main, []) == 3
    assert "1 FAIL" in capsys.readouterr().out


def test_json_output(env, monkeypatch, capsys):
    no_nvml(monkeypatch)
    monkeypatch.setenv("MLM_LOG_FORMAT", "json")
    assert run_main(doctor.main, []) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is True
    assert {c["name"]: c["status"] for c in document["checks"]}["gpus"] == "WARN"


def test_config_error_exits_2(env):
    done = subprocess.run(
        [sys.executable, "-m", "train.doctor", "--num_train_epochs", "many"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlm-trainer: error: ") and "num_train_epochs" in lines[0]


def test_a_broken_check_is_a_fail_row_not_a_crash(env, monkeypatch):
    no_nvml(monkeypatch)

    def broken(environ):
        raise KeyError("boom")

    monkeypatch.setattr(doctor, "check_master", broken)
    found = checks()
    assert found["master"].status == "FAIL" and "KeyError" in found["master"].detail
    assert found["dataset"].status == "OK"


# ---- GPUs through the fake NVML ----------------------------------------------------------------------------------


def test_healthy_gpus(env, monkeypatch):
    fake_nvml(monkeypatch, count=2, cuda=12040)
    calls = fast_nccl(monkeypatch)
    found = checks(monkeypatch, cuda="12.4", count=2)
    assert found["gpus"].status == "OK" and "2 × NVIDIA H100 80GB HBM3 (80 GiB)" in found["gpus"].detail
    assert "driver 550.54.15" in found["gpus"].detail
    assert found["driver"].status == "OK" and found["torch.cuda"].status == "OK"
    assert found["nccl"].status == "OK" and "150.0 GB/s" in found["nccl"].detail and calls == [2]
    assert all(c.status in ("OK", "SKIP") for c in found.values()), found


def test_driver_too_old_for_torch_cuda_fails(env, monkeypatch):
    fake_nvml(monkeypatch, count=1, cuda=11080, driver="520.61.05")
    found = checks(monkeypatch, cuda="12.4", count=0)
    assert found["driver"].status == "FAIL" and "too old" in found["driver"].detail
    assert ">= 525.60.13" in found["driver"].fix
    assert found["torch.cuda"].status == "FAIL" and "driver too old" in found["torch.cuda"].detail


def test_older_minor_cuda_version_warns(env, monkeypatch):
    fake_nvml(monkeypatch, count=1, cuda=12020)
    assert checks(monkeypatch, cuda="12.4", count=1)["driver"].status == "WARN"


def test_cpu_build_of_torch_with_gpus_fails(env, monkeypatch):
    fake_nvml(monkeypatch, count=1)
    found = checks(monkeypatch, cuda=None, count=0)
    assert found["driver"].status == "FAIL" and "CPU build" in found["driver"].detail


def test_torch_sees_fewer_gpus_than_nvml_fails(env, monkeypatch):
    fake_nvml(monkeypatch, count=4)
    fast_nccl(monkeypatch)
    found = checks(monkeypatch, count=3)
    assert found["torch.cuda"].status == "FAIL" and "3 of the 4" in found["torch.cuda"].detail


def test_cuda_visible_devices_explains_a_smaller_count(env, monkeypatch):
    fake_nvml(monkeypatch, count=4)
    fast_nccl(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,GPU-3")
    found = checks(monkeypatch, count=2)
    assert found["torch.cuda"].status == "OK", found["torch.cuda"]


def test_torch_sees_more_gpus_than_nvml_warns(env, monkeypatch):
    fake_nvml(monkeypatch, count=1)
    fast_nccl(monkeypatch)
    assert checks(monkeypatch, count=2)["torch.cuda"].status == "WARN"


def test_a_gpu_that_cannot_compute_fails(env, monkeypatch):
    fake_nvml(monkeypatch, count=1)
    found = checks(monkeypatch, count=1, probe="GPU 0: CUDA error: uncorrectable ECC error encountered")
    assert found["torch.cuda"].status == "FAIL" and "ECC" in found["torch.cuda"].detail


# ---- NCCL ----------------------------------------------------------------------------------------------------------


def test_nccl_results():
    two = doctor.TorchView(version="x", cuda_build="12.4", available=True, count=2)
    assert doctor.check_nccl(two, lambda n: {"busbw_gbps": 3.0}).status == "WARN"

    def hang(n: int) -> dict:
        raise TimeoutError("no result within 120 s")

    failed = doctor.check_nccl(two, hang)
    assert failed.status == "FAIL" and "120 s" in failed.detail and "NCCL_DEBUG=INFO" in failed.fix
    one = doctor.TorchView(version="x", cuda_build="12.4", available=True, count=1)
    assert doctor.check_nccl(one, hang).status == "SKIP"


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a GPU (bench/gpu_check.sh runs it where one is lent)")
def test_nccl_allreduce_on_real_gpus():
    result = doctor.nccl_allreduce(torch.cuda.device_count(), size_mib=64, iters=5)
    assert result["seconds"] > 0 and result["algbw_gbps"] > 0


# ---- directories and /dev/shm ----------------------------------------------------------------------------------------


def test_output_under_a_file_fails(env, tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    (tmp_path / "plain-file").write_text("x")
    monkeypatch.setenv("MLM_OUTPUT_DIR", str(tmp_path / "plain-file" / "out"))
    assert checks()["output_dir"].status == "FAIL"


def test_unwritable_output_fails(env, tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    (tmp_path / "out").mkdir()

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # root ignores file modes, so the refusal is simulated at the one call that tests writing
    monkeypatch.setattr(doctor.tempfile, "NamedTemporaryFile", denied)
    found = checks()
    assert found["output_dir"].status == "FAIL" and "not writable (Permission denied)" in found["output_dir"].detail
    assert found["cache (HF_HOME)"].status == "FAIL"


def test_output_holding_a_finished_model_fails_and_checkpoints_are_noted(env, tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    (tmp_path / "out" / "checkpoint-40").mkdir(parents=True)
    (tmp_path / "out" / "checkpoint-40" / ".complete").write_text("x")
    assert "will resume from checkpoint-40" in checks()["output_dir"].detail
    (tmp_path / "out" / "final").mkdir()
    found = checks()["output_dir"]
    assert found.status == "FAIL" and "MLM_OVERWRITE_OUTPUT_DIR=true" in found.fix


@pytest.mark.parametrize(("free_gib", "status"), [(0.5, "FAIL"), (5, "WARN"), (50, "OK")])
def test_free_space(tmp_path, monkeypatch, free_gib, status):
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: SimpleNamespace(free=int(free_gib * 1024**3)))
    assert doctor.check_writable("output_dir", tmp_path, "fix").status == status


@pytest.mark.parametrize(
    ("size_mib", "workers", "ranks", "status"),
    [
        (64, 2, 1, "FAIL"),
        (64, 0, 1, "OK"),
        (64, 0, 2, "FAIL"),
        (768, 2, 1, "WARN"),
        (2048, 2, 8, "WARN"),
        (16384, 2, 8, "OK"),
    ],
)
def test_shm(tmp_path, monkeypatch, size_mib, workers, ranks, status):
    blocks = size_mib * 256  # 4 KiB blocks
    monkeypatch.setattr(
        doctor.os, "statvfs", lambda p: SimpleNamespace(f_blocks=blocks, f_bavail=blocks - 10, f_frsize=4096)
    )
    config = load_config(["--dataloader_num_workers", str(workers)], environ={})
    assert doctor.check_shm(config, ranks).status == status


# ---- model and dataset -------------------------------------------------------------------------------------------


def test_offline_hub_model_not_cached_fails_then_cached_passes(env, tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "org/model")
    found = checks()["model"]
    assert found.status == "FAIL" and "offline" in found.detail
    (tmp_path / "hf" / "hub" / "models--org--model" / "snapshots").mkdir(parents=True)
    assert checks()["model"].status == "OK"


def test_online_hub_answers(env, monkeypatch):
    no_nvml(monkeypatch)
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(doctor, "hub_info", lambda repo, kind, timeout: asked.append((repo, kind)))
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "org/model")
    monkeypatch.setenv("MLM_DATASET", "org/data")
    found = checks()
    assert found["model"].status == "OK" and found["dataset"].status == "OK"
    assert asked == [("org/model", "model"), ("org/data", "dataset")]


def test_hub_unknown_repo_and_unreachable_hub(env, tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "org/model")

    def not_found(repo, kind, timeout):
        raise RepositoryNotFoundError("404", response=SimpleNamespace(headers={}, status_code=404, request=None))

    monkeypatch.setattr(doctor, "hub_info", not_found)
    found = checks()["model"]
    assert found.status == "FAIL" and "not on the hub" in found.detail and "HF_TOKEN_FILE" in found.fix

    def unreachable(repo, kind, timeout):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(doctor, "hub_info", unreachable)
    assert checks()["model"].status == "FAIL"
    (tmp_path / "hf" / "hub" / "models--org--model" / "snapshots").mkdir(parents=True)
    cached = checks()["model"]
    assert cached.status == "WARN" and "HF_HUB_OFFLINE=1" in cached.fix


def test_local_model_and_data(env, tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", str(tmp_path / "model"))
    monkeypatch.setenv("MLM_DATASET", str(tmp_path / "train.txt"))
    found = checks()
    assert found["model"].status == "FAIL" and found["dataset"].status == "FAIL"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "train.txt").write_text("hello\n")
    found = checks()
    assert found["model"].status == "OK" and found["dataset"].status == "OK"


def test_unknown_scratch_model_type_fails(env, monkeypatch):
    no_nvml(monkeypatch)
    monkeypatch.setenv("MLM_MODEL_NAME_OR_PATH", "scratch:nosuchmodel")
    assert checks()["model"].status == "FAIL"


# ---- multi-node --------------------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_master_port_closed_fails_and_open_passes():
    port = closed_port()
    found = doctor.check_master({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "1"})
    assert found.status == "FAIL" and "start the master node" in found.fix
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        environ = {
            "PET_MASTER_ADDR": "localhost",
            "PET_MASTER_PORT": str(server.getsockname()[1]),
            "PET_NODE_RANK": "2",
        }
        assert doctor.check_master(environ).status == "OK"


def test_master_address_that_does_not_resolve_fails():
    found = doctor.check_master({"MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29500", "NODE_RANK": "1"})
    assert found.status == "FAIL" and "does not resolve" in found.detail


def test_master_node_checks_its_port_is_free():
    assert (
        doctor.check_master({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(closed_port()), "NODE_RANK": "0"}).status
        == "OK"
    )
    with socket.socket() as server:
        server.bind(("", 0))
        server.listen()
        busy = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.getsockname()[1]), "NODE_RANK": "0"}
        assert doctor.check_master(busy).status == "WARN"
    assert doctor.check_master({}).status == "SKIP"
