"""Processes per node and precision: the pure deciding functions, and what they make of the hardware."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests.fakes import FakeDevice, FakeNvml, h100s, install, uuid_of
from tests.launch.common import gpus_of, job_flags, plan_ok, run_plan
from train.common.errors import ConfigError, EnvironmentProblem
from train.config import MAX_PROCESSES, shown
from train.launch import decide


@pytest.mark.parametrize(
    ("cc", "precision", "flags"),
    [
        ((9, 0), "bf16", ["--bf16", "true", "--tf32", "true"]),
        ((8, 0), "bf16", ["--bf16", "true", "--tf32", "true"]),
        ((7, 5), "fp16", ["--fp16", "true"]),
        ((7, 0), "fp16", ["--fp16", "true"]),
        ((6, 0), "fp32", []),
    ],
)
def test_precision_from_the_hardware(monkeypatch, capsys, base_env, cc, precision, flags):
    install(monkeypatch, gpus_of(cc))
    document = plan_ok(monkeypatch, capsys, base_env)
    assert document["precision"] == precision
    assert job_flags(document) == ["--ddp_backend", "nccl", *flags]


def test_mixed_gpus_use_the_weakest(monkeypatch, capsys, base_env):
    fake = FakeNvml([FakeDevice(uuid_of(0), cc=(8, 0)), FakeDevice(uuid_of(1), cc=(7, 0))])
    install(monkeypatch, fake)
    assert plan_ok(monkeypatch, capsys, base_env)["precision"] == "fp16"


def test_user_fp16_on_cpu_is_an_error(monkeypatch, capsys, base_env, no_nvml):
    code, _, err = run_plan(monkeypatch, capsys, {**base_env, "MLM_FP16": "true"})
    assert code == 2
    assert "MLM_FP16: fp16 needs a GPU" in err


def test_user_fp16_on_ampere_is_kept(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(1))
    document = plan_ok(monkeypatch, capsys, {**base_env, "MLM_FP16": "true"})
    assert (document["precision"], document["precision_source"]) == ("fp16", "MLM_FP16")
    assert job_flags(document) == ["--ddp_backend", "nccl", "--tf32", "true"]


def test_decide_precision_checks_what_the_user_asked_for():
    # (The launcher's own TrainingArguments would already refuse bf16/tf32 without CUDA, so these are unit tests.)
    with pytest.raises(
        ConfigError, match=r"--bf16: bf16 needs compute capability 8\.0 or newer, not compute capability 7\.0"
    ):
        decide.decide_precision(False, True, None, {"bf16": "--bf16"}, (7, 0))
    with pytest.raises(ConfigError, match="MLM_TF32: tf32 needs compute capability 8.0"):
        decide.decide_precision(False, False, True, {"tf32": "MLM_TF32"}, (7, 5))
    with pytest.raises(ConfigError, match="tf32 needs compute capability 8.0 or newer, not the CPU"):
        decide.decide_precision(False, False, True, {"tf32": "MLM_TF32"}, None)
    kept = decide.decide_precision(False, True, None, {"bf16": "job.yaml: bf16"}, (8, 6))
    assert (kept.name, kept.flags, kept.source) == ("bf16", ("--tf32", "true"), "job.yaml: bf16")
    # An explicit "no" is a choice too.
    off = decide.decide_precision(False, False, False, {"bf16": "--bf16", "tf32": "--tf32"}, (9, 0))
    assert (off.name, off.tf32, off.flags) == ("fp32", False, ())
    assert decide.decide_precision(False, True, None, {"bf16": "--bf16"}, None).name == "bf16"  # CPU autocast


@pytest.mark.parametrize(
    ("requested", "pet", "gpus", "expected"),
    [
        (None, None, 8, 8),
        (None, None, 0, 1),
        ("auto", None, 2, 2),
        (None, "auto", 0, 1),
        (None, "gpu", 4, 4),
        (None, "cpu", 0, 16),
        (None, "3", 8, 3),
        ("2", "3", 8, 2),
        ("4", None, 0, 4),  # several CPU processes when asked for
    ],
)
def test_decide_nproc(requested, pet, gpus, expected):
    assert decide.decide_nproc(requested, "MLM_NPROC_PER_NODE", pet, gpus, cpu_count=16)[0] == expected


def test_decide_nproc_errors():
    with pytest.raises(ConfigError, match="only 8 GPU"):
        decide.decide_nproc("16", "MLM_NPROC_PER_NODE", None, 8, 4)
    with pytest.raises(EnvironmentProblem, match="PET_NPROC_PER_NODE=gpu but no GPU"):
        decide.decide_nproc(None, "x", "gpu", 0, 4)
    with pytest.raises(ConfigError, match="PET_NPROC_PER_NODE='many'"):
        decide.decide_nproc(None, "x", "many", 0, 4)


@pytest.mark.parametrize("value", ["5000", "1025", "0", "²", "-1", "1" * 100])
def test_pet_nproc_per_node_is_bounded_as_the_option_is(value):
    """MLM_NPROC_PER_NODE stops at MAX_PROCESSES (train.config); PET_NPROC_PER_NODE did not (5000 on a CPU reached
    torchrun), and a superscript digit passed str.isdigit to crash in int()."""
    expected = f"PET_NPROC_PER_NODE={shown(value)}: expected a positive integer up to {MAX_PROCESSES}, auto, gpu or cpu"
    with pytest.raises(ConfigError) as caught:
        decide.decide_nproc(None, "x", value, 0, 4)
    assert str(caught.value) == expected


def test_pet_nproc_per_node_up_to_the_bound_is_taken():
    assert decide.decide_nproc(None, "x", str(MAX_PROCESSES), 0, 4) == (MAX_PROCESSES, "PET_NPROC_PER_NODE")
    assert decide.decide_nproc("2", "MLM_NPROC_PER_NODE", "5000", 0, 4)[0] == 2  # the option wins, as before


def test_a_huge_pet_nproc_per_node_exits_2_in_one_line(monkeypatch, capsys, base_env, no_nvml):
    code, _, err = run_plan(monkeypatch, capsys, {**base_env, "PET_NPROC_PER_NODE": "5000"})
    assert code == 2
    assert err.strip().splitlines() == [
        "mlm-trainer: error: PET_NPROC_PER_NODE='5000': expected a positive integer up to 1024, auto, gpu or cpu"
    ]


def test_usable_cpus_is_capped_by_the_cgroup_quota(tmp_path):
    """A pod limited to 1.5 CPUs gets 2 workers' worth, not the node's count; no quota leaves the affinity mask."""
    from train.machine.resources import cgroup_cpu_quota, usable_cpus

    mask = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(str(v2)) == 1.5
    assert usable_cpus(str(v2)) == min(mask, 2)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(str(v2)) is None
    assert usable_cpus(str(v2)) == mask
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(str(v1)) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(str(v1)) is None
    assert cgroup_cpu_quota(str(tmp_path / "missing")) is None


def test_cpu_ranks_pad_to_the_longest_and_gpu_ranks_to_a_multiple_of_8(monkeypatch, capsys, base_env, no_nvml):
    document = plan_ok(monkeypatch, capsys, base_env)
    flags = job_flags(document)
    assert flags[flags.index("--pad_to_multiple_of") + 1] == "1"
    assert document["config"]["pad_to_multiple_of"] == 1  # what plan and run.json show
    # chosen by the user: kept, on a CPU too
    chosen = job_flags(plan_ok(monkeypatch, capsys, {**base_env, "MLM_PAD_TO_MULTIPLE_OF": "8"}))
    assert "--pad_to_multiple_of" not in chosen


def test_gpu_ranks_keep_the_multiple_of_8(monkeypatch, capsys, base_env):
    install(monkeypatch, h100s(1))
    assert "--pad_to_multiple_of" not in job_flags(plan_ok(monkeypatch, capsys, base_env))


def test_decide_pad_multiple():
    assert decide.decide_pad_multiple(8, None, cpu_mode=True) == ("--pad_to_multiple_of", "1")
    assert decide.decide_pad_multiple(8, None, cpu_mode=False) == ()
    assert decide.decide_pad_multiple(8, "MLM_PAD_TO_MULTIPLE_OF", cpu_mode=True) == ()
    assert decide.decide_pad_multiple(1, None, cpu_mode=True) == ()


def test_decide_log_format():
    assert decide.decide_log_format("auto", "text") == ("--log_format", "text")
    assert decide.decide_log_format("json", "text") == ()


def test_decide_use_cpu():
    assert decide.decide_use_cpu(False, None, cpu_mode=True) == (("--use_cpu", "true"), None)
    assert decide.decide_use_cpu(True, "MLM_USE_CPU", cpu_mode=True) == ((), None)
    assert decide.decide_use_cpu(False, None, cpu_mode=False) == ((), None)
    flags, warning = decide.decide_use_cpu(False, "MLM_USE_CPU", cpu_mode=True)
    assert flags == () and warning is not None and warning.startswith("MLM_USE_CPU=false on a node without GPU")


def test_decide_backend():
    assert decide.decide_backend(None, cpu_mode=True) == ("gloo", ("--ddp_backend", "gloo"))
    assert decide.decide_backend("", cpu_mode=False) == ("nccl", ("--ddp_backend", "nccl"))
    assert decide.decide_backend("gloo", cpu_mode=False) == ("gloo", ())


def test_decide_max_restarts():
    cluster = SimpleNamespace(max_restarts=5)
    assert decide.decide_max_restarts(0, user_set=False, topology=cluster) == 5
    assert decide.decide_max_restarts(2, user_set=True, topology=cluster) == 2
    assert decide.decide_max_restarts(0, user_set=False, topology=SimpleNamespace(max_restarts=None)) == 0
