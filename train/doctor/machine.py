"""The machine rows: the GPUs (train.machine.gpus), the driver, torch's own view of CUDA, /dev/shm, and the
launcher's plan.

Every decision here is the launcher's: the inventory is ``gpus.detect``, the driver verdict ``gpus.check_driver``,
the /dev/shm verdict ``decide.shm_warning`` and the processes, backend, precision and batch come from the very
plan ``make_plan`` builds for a launch. What is doctor's own is the torch side: whether torch sees the GPUs the
inventory lists, and whether it can compute on each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from train.common.console import resolve_format
from train.common.errors import UserError
from train.common.hf import cache_root
from train.config import Config
from train.doctor.rows import FAIL, OK, SKIP, WARN, Check
from train.launch.decide import shm_warning
from train.launch.inputs import Host, Launch
from train.launch.plan import Plan, make_plan, sharding_plan, torchrun_path
from train.machine import gpus
from train.machine.gpus import Inventory, format_cuda_version, torch_cuda_version
from train.machine.peaks import device_peak
from train.machine.resources import usable_cpus

GIB = 1024**3
MIB = 1024**2
GPU_FIX = (
    "give the container the GPUs: docker run --gpus all (NVIDIA Container Toolkit on the host); Kubernetes: "
    "resources.limits nvidia.com/gpu with the NVIDIA device plugin"
)


@dataclass
class TorchView:
    version: str
    cuda_build: str | None  # the CUDA version torch was built for: None for a CPU build
    available: bool
    count: int
    error: str | None = None


def torch_view() -> TorchView:
    import torch

    view = TorchView(
        version=torch.__version__, cuda_build=torch_cuda_version(), available=torch.cuda.is_available(), count=0
    )
    if view.available:
        view.count = torch.cuda.device_count()
    elif view.cuda_build:
        try:  # is_available() is silent; init() says why (e.g. "The NVIDIA driver on your system is too old")
            torch.cuda.init()
        except Exception as exc:
            view.error = " ".join(str(exc).split())[:300]
    return view


def probe_devices(count: int) -> str | None:
    """Allocate and compute on each GPU; the first error, or None."""
    import torch

    for index in range(count):
        try:
            x = torch.ones(1024, device=f"cuda:{index}")
            float((x * 2).sum())
        except Exception as exc:
            return f"GPU {index}: " + " ".join(str(exc).split())[:300]
    return None


def check_gpus(inventory: Inventory) -> Check:
    """What ``gpus.detect`` leaves this run, and the notes saying why devices were left out."""
    notes = [note for note in inventory.notes if inventory.gpus or note != inventory.cpu_reason]
    data = {"uuids": [g.uuid for g in inventory.gpus], "notes": notes}
    if not inventory.gpus:
        # The launcher's own words for CPU mode (the processes row leaves this warning to this row).
        detail = f"no GPU visible: CPU mode ({inventory.cpu_reason})"
        return Check("gpus", WARN, "; ".join([detail, *notes]), GPU_FIX, data)
    names: dict[str, int] = {}
    for gpu in inventory.gpus:
        label = f"{gpu.name} ({gpu.memory_total_bytes / GIB:.0f} GiB)"
        names[label] = names.get(label, 0) + 1
    listed = ", ".join(f"{n} × {label}" for label, n in names.items())
    return Check("gpus", OK, "; ".join([f"{listed}; driver {inventory.driver_version}", *notes]), data=data)


def check_driver(inventory: Inventory, torch_cuda: str | None) -> Check:
    """``gpus.check_driver`` as a row: its EnvironmentProblem is a FAIL, its warning a WARN."""
    if not inventory.gpus:
        return Check("driver", SKIP, "no GPU")
    try:
        warning = gpus.check_driver(inventory, torch_cuda)
    except UserError as exc:
        return Check("driver", FAIL, str(exc))
    if warning:
        return Check("driver", WARN, warning)
    have = format_cuda_version(inventory.cuda_driver_version) or "an unknown version"
    return Check(
        "driver", OK, f"driver {inventory.driver_version} supports CUDA {have}; torch is built for CUDA {torch_cuda}"
    )


def check_torch_cuda(inventory: Inventory, torch: TorchView, environ: Mapping[str, str]) -> Check:
    visible = len(inventory.gpus)
    if not visible:
        if torch.available:
            return Check("torch.cuda", WARN, f"torch sees {torch.count} GPU(s) but NVML leaves none visible", GPU_FIX)
        return Check("torch.cuda", SKIP, "no GPU")
    scope = f" (CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']})" if "CUDA_VISIBLE_DEVICES" in environ else ""
    if not torch.available:
        return Check(
            "torch.cuda",
            FAIL,
            f"NVML leaves {visible} GPU(s) visible but torch.cuda cannot use any{scope}"
            + (f": {torch.error}" if torch.error else ""),
            "see the driver row; check CUDA_VISIBLE_DEVICES and that the container was started with the GPUs",
        )
    if torch.count < visible:
        return Check(
            "torch.cuda",
            FAIL,
            f"torch sees {torch.count} of the {visible} GPU(s) NVML leaves visible{scope}",
            "a GPU is in a bad state (nvidia-smi -q; dmesg for Xid errors); reset or exclude it",
        )
    if torch.count > visible:
        return Check(
            "torch.cuda",
            WARN,
            f"torch sees {torch.count} GPU(s), NVML {visible}{scope}",
            "check CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES match the GPUs you mean to use",
        )
    problem = probe_devices(torch.count)
    if problem:
        return Check("torch.cuda", FAIL, problem, "nvidia-smi -q and dmesg (Xid errors) on the host; reset the GPU")
    return Check("torch.cuda", OK, f"torch {torch.version} uses all {torch.count} GPU(s){scope}")


def check_shm(shm_bytes: int | None, workers: int) -> Check:
    """The launcher's /dev/shm rule (``decide.shm_warning``): WARN with its message, else OK with the size."""
    data = {"bytes": shm_bytes, "dataloader_num_workers": workers}
    warning = shm_warning(shm_bytes, workers)
    if warning:
        return Check("/dev/shm", WARN, warning, data=data)
    if shm_bytes is None:
        return Check("/dev/shm", OK, "missing; dataloader_num_workers=0 does not need it", data=data)
    return Check("/dev/shm", OK, f"{shm_bytes / MIB:,.0f} MiB for dataloader_num_workers={workers}", data=data)


def plan_or_refusal(
    config: Config,
    inventory: Inventory,
    environ: Mapping[str, str],
    argv: Sequence[str],
    torch_cuda: str | None,
    shm_bytes: int | None,
) -> Plan | Exception:
    """The plan the launcher would make here, with the same inputs; or why it would refuse (or why planning broke).
    It takes the whole Config because make_plan assembles the plan from it."""
    try:
        host = Host(inventory, torch_cuda, usable_cpus(), shm_bytes)
        return make_plan(config, host, environ, argv, Launch(torchrun_path(), resolve_format(config.launch.log_format)))
    except Exception as exc:  # a UserError: the launcher's refusal; anything else: a broken check, shown as such
        return exc


def check_sharding(outcome: Plan | Exception, requested: str, estimate: Callable[[], dict[str, int] | None]) -> Check:
    """The sharding the ranks will train with and why (``requested``: MLM_SHARDING), with DDP's memory estimate
    (train/launch/plan.py), made only when there is a plan."""
    if not isinstance(outcome, Plan):
        return Check("sharding", WARN, "no plan to estimate from (see the plan row)")
    facts = sharding_plan(outcome, requested, estimate())
    return Check("sharding", OK, facts["choice"], data=facts)


def check_peak(outcome: Plan | Exception, inventory: Inventory, environ: Mapping[str, str]) -> Check:
    """The peak the training records' MFU will be a share of, by the ranks' own rule (train/machine/peaks.py
    ``device_peak``): the first GPU's datasheet rate at the plan's precision, or this CPU's measured rate on the
    threads a rank gets (the plan's OMP_NUM_THREADS, else torch's own count), the probe run on that many."""
    if not isinstance(outcome, Plan):
        return Check("peak (MFU)", SKIP, "no plan to take the precision from (see the plan row)")
    import torch  # torch_view imported it already

    name = inventory.gpus[0].name if inventory.gpus else None
    threads = int(outcome.env.get("OMP_NUM_THREADS") or torch.get_num_threads())
    peak = device_peak(name, outcome.precision.label, threads, cache_root(environ))
    if peak is None:
        detail = f"{name} at {outcome.precision.label} is not in the table of peaks: the records carry no MFU"
        return Check("peak (MFU)", SKIP, detail, data={"flops": None})
    detail = f"{peak.flops / 1e12:,.3g} TFLOP/s ({peak.source}): the training records' MFU is a share of it"
    return Check("peak (MFU)", OK, detail, data={"flops": peak.flops, "source": peak.source})


def check_processes(outcome: Plan | Exception, shown: Sequence[Check]) -> Check:
    """The plan as a row: processes, backend, precision and batch; its warnings that no earlier row carries."""
    if isinstance(outcome, UserError):
        return Check("plan", FAIL, f"the launcher would refuse to start: {outcome}")
    if isinstance(outcome, Exception):
        return Check("plan", FAIL, f"the check itself failed: {type(outcome).__name__}: {outcome}", "MLM_DEBUG=1")
    plan = outcome
    detail = (
        f"{plan.nproc_per_node} per node ({plan.nproc_source}); backend {plan.backend}; "
        f"precision {plan.precision.label} ({plan.precision.source}); {plan.batch.banner}"
    )
    data = {
        "nproc_per_node": plan.nproc_per_node,
        "nproc_source": plan.nproc_source,
        "backend": plan.backend,
        "precision": plan.precision.label,
        "batch": plan.batch.banner,
        "cuda_visible_devices": plan.env["CUDA_VISIBLE_DEVICES"],
        "warnings": plan.warnings,
    }
    unshown = [w for w in plan.warnings if not any(w in row.detail for row in shown)]
    if unshown:
        return Check("processes", WARN, "; ".join([detail, *unshown]), data=data)
    return Check("processes", OK, detail, data=data)
