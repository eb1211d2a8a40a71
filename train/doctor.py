"""A preflight before a long job: ``python -m train.doctor [options]`` (``entrypoint.sh doctor``).

Prints one row per check, OK / WARN / FAIL / SKIP, with a fix under every WARN and FAIL; exits 0 when nothing FAILs,
3 (an environment problem) when something does, 2 on a configuration error. It takes the same options as a training
run (YAML, MLM_* variables, flags), so it checks the run you are about to start: its output_dir, model, dataset,
dataloader workers and processes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from train.config import Config, load_config
from train.errors import EXIT_ENVIRONMENT, run_main
from train.launch import as_launcher

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"
GIB = 1024**3
MIB = 1024**2
# Free space below which a run is likely to die writing checkpoints (FAIL) or may (WARN).
FREE_FAIL = 1 * GIB
FREE_WARN = 10 * GIB
# Docker's default /dev/shm is 64 MiB: dataloader workers and NCCL's shared-memory transport both overflow it.
SHM_FAIL = 256 * MIB
SHM_WARN_PER_RANK = 512 * MIB
HUB_TIMEOUT_S = 10.0
NCCL_TIMEOUT_S = 120.0
LOW_BUSBW_GBPS = 10.0  # below this, all-reduce traffic is likely going through the host (no P2P / NVLink)
CONNECT_TIMEOUT_S = 3.0
# Oldest Linux driver for each CUDA major version (CUDA minor version compatibility, NVIDIA's compatibility docs).
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


# ---- what the machine has ----------------------------------------------------------------------------------------


@dataclass
class NvmlView:
    """NVML's inventory: every GPU in this container (CUDA_VISIBLE_DEVICES does not hide GPUs from NVML)."""

    error: str | None = None
    driver: str | None = None
    cuda_driver: tuple[int, int] | None = None  # the newest CUDA version the driver supports
    gpus: list[dict[str, Any]] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_view() -> NvmlView:
    try:
        import pynvml
    except ImportError:
        return NvmlView(error="the nvidia-ml-py package is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no usable GPU driver here
        return NvmlView(error=str(exc) or type(exc).__name__)
    try:
        view = NvmlView(driver=_text(pynvml.nvmlSystemGetDriverVersion()))
        try:
            version = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        except Exception:
            version = int(pynvml.nvmlSystemGetCudaDriverVersion())
        view.cuda_driver = (version // 1000, (version % 1000) // 10)
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except Exception:
                uuid = ""
            view.gpus.append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": uuid,
                    "memory_gib": pynvml.nvmlDeviceGetMemoryInfo(handle).total / GIB,
                }
            )
        return view
    except Exception as exc:
        return NvmlView(error=str(exc) or type(exc).__name__)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def visible_gpus(view: NvmlView, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """The NVML GPUs torch should see, after CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return view.gpus
    wanted = [part.strip() for part in value.split(",") if part.strip()]
    return [g for g in view.gpus if str(g["index"]) in wanted or (g["uuid"] and g["uuid"] in wanted)]


@dataclass
class TorchView:
    version: str
    cuda_build: str | None  # torch.version.cuda: None for a CPU build
    available: bool
    count: int
    error: str | None = None


def torch_view() -> TorchView:
    import torch

    view = TorchView(
        version=torch.__version__, cuda_build=torch.version.cuda, available=torch.cuda.is_available(), count=0
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


# ---- checks ------------------------------------------------------------------------------------------------------

GPU_FIX = (
    "give the container the GPUs: docker run --gpus all (NVIDIA Container Toolkit on the host); Kubernetes: "
    "resources.limits nvidia.com/gpu with the NVIDIA device plugin"
)


def check_gpus(view: NvmlView, config: Config) -> Check:
    if view.error or not view.gpus:
        reason = f"NVML: {view.error}" if view.error else "NVML lists no GPU"
        if config.job.require_gpu:
            return Check("gpus", FAIL, f"no NVIDIA GPU ({reason}) and require_gpu is set", GPU_FIX)
        return Check("gpus", WARN, f"no NVIDIA GPU ({reason}): training will run on the CPU", GPU_FIX)
    names: dict[str, int] = {}
    for gpu in view.gpus:
        label = f"{gpu['name']} ({gpu['memory_gib']:.0f} GiB)"
        names[label] = names.get(label, 0) + 1
    listed = ", ".join(f"{n} × {label}" for label, n in names.items())
    return Check("gpus", OK, f"{listed}; driver {view.driver}")


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def check_driver(view: NvmlView, torch: TorchView) -> Check:
    if not view.gpus:
        return Check("driver", SKIP, "no GPU")
    if not torch.cuda_build:
        return Check(
            "driver",
            FAIL,
            f"torch {torch.version} is a CPU build: it cannot use the GPUs",
            "use the image's CUDA build of torch (the image pins it); a CPU wheel was installed over it",
        )
    need = _version(torch.cuda_build)
    have = view.cuda_driver or (0, 0)
    detail = f"driver {view.driver} supports CUDA {have[0]}.{have[1]}; torch is built for CUDA {torch.cuda_build}"
    minimum = MIN_DRIVER.get(need[0], "a newer one")
    if have >= need:
        return Check("driver", OK, detail)
    if have[0] == need[0]:
        return Check(
            "driver",
            WARN,
            detail + " (runs through CUDA minor-version compatibility; kernels that need JIT compilation may fail)",
            f"upgrade the host's NVIDIA driver to one supporting CUDA {torch.cuda_build}",
        )
    return Check(
        "driver",
        FAIL,
        detail + ": the driver is too old",
        f"upgrade the host's NVIDIA driver to >= {minimum} (CUDA {need[0]}.x), or use an image built for "
        f"CUDA {have[0]}.x",
    )


def check_torch_cuda(view: NvmlView, torch: TorchView, environ: Mapping[str, str]) -> Check:
    visible = visible_gpus(view, environ)
    if not view.gpus:
        if torch.available:
            return Check("torch.cuda", WARN, f"torch sees {torch.count} GPU(s) but NVML sees none", GPU_FIX)
        return Check("torch.cuda", SKIP, "no GPU")
    restricted = "CUDA_VISIBLE_DEVICES" in environ
    scope = f" (CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']})" if restricted else ""
    if not torch.available:
        return Check(
            "torch.cuda",
            FAIL,
            f"NVML sees {len(view.gpus)} GPU(s) but torch.cuda cannot use any{scope}"
            + (f": {torch.error}" if torch.error else ""),
            "see the driver row; check CUDA_VISIBLE_DEVICES and that the container was started with the GPUs",
        )
    if torch.count < len(visible):
        return Check(
            "torch.cuda",
            FAIL,
            f"torch sees {torch.count} of the {len(visible)} GPU(s) NVML lists{scope}",
            "a GPU is in a bad state (nvidia-smi -q; dmesg for Xid errors) or hidden by CUDA_VISIBLE_DEVICES; "
            "reset or exclude it",
        )
    if torch.count > len(visible):
        return Check(
            "torch.cuda",
            WARN,
            f"torch sees {torch.count} GPU(s), NVML {len(visible)}{scope} (MIG instances?)",
            "check CUDA_VISIBLE_DEVICES matches the GPUs you mean to use",
        )
    problem = probe_devices(torch.count)
    if problem:
        return Check("torch.cuda", FAIL, problem, "nvidia-smi -q and dmesg (Xid errors) on the host; reset the GPU")
    return Check("torch.cuda", OK, f"torch {torch.version} uses all {torch.count} GPU(s){scope}")


def ranks_per_node(config: Config, gpu_count: int) -> int:
    value = config.job.nproc_per_node
    if value and value.isdigit():
        return int(value)
    return max(gpu_count, 1)


def check_shm(config: Config, ranks: int, path: str = "/dev/shm") -> Check:
    workers = config.training.dataloader_num_workers
    who = f"{ranks} rank(s) × {workers} dataloader worker(s)"
    fix = (
        "docker run --shm-size=8g (or --ipc=host); Kubernetes: mount a memory-backed emptyDir at /dev/shm "
        "(k8s/ does); or MLM_DATALOADER_NUM_WORKERS=0"
    )
    try:
        stats = os.statvfs(path)
    except OSError:
        return Check("/dev/shm", WARN, f"{path} is missing", fix)
    size, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
    detail = f"{size / MIB:,.0f} MiB ({free / MIB:,.0f} MiB free) for {who}"
    if workers == 0 and ranks == 1:
        return Check("/dev/shm", OK, detail + ": hardly used")
    if free < SHM_FAIL:
        return Check("/dev/shm", FAIL, detail + ": too small (dataloader workers die with a bus error)", fix)
    if size < max(GIB, SHM_WARN_PER_RANK * ranks):
        return Check("/dev/shm", WARN, detail + ": small for this many processes", fix)
    return Check("/dev/shm", OK, detail)


def _existing_ancestor(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(name: str, path: Path, fix: str) -> Check:
    """Writable (tested without leaving anything behind) and enough free space."""
    path = path.expanduser().absolute()
    target = _existing_ancestor(path)
    if not target.is_dir():
        return Check(name, FAIL, f"{path}: {target} is not a directory", fix)
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".doctor-write-test-"):
            pass
    except OSError as exc:
        reason = "no space left on the device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        where = "" if target == path else f" (its nearest existing parent {target})"
        return Check(name, FAIL, f"{path}{where}: not writable ({reason})", fix)
    free = shutil.disk_usage(target).free
    detail = f"{path}: writable, {free / GIB:,.1f} GiB free"
    if free < FREE_FAIL:
        return Check(name, FAIL, detail, "free space or mount a larger volume: checkpoints will not fit")
    if free < FREE_WARN:
        return Check(name, WARN, detail, "checkpoints of a large model may not fit; mount a larger volume")
    return Check(name, OK, detail)


def check_output(config: Config) -> Check:
    from train.outputs import COMPLETE_MARKER, FINAL, checkpoints

    output = Path(config.training.output_dir)
    label = config.source_of("output_dir")
    check = check_writable(
        "output_dir", output, f"mount a writable volume there (owned by the image's user) or set {label}"
    )
    if check.status == FAIL or not output.is_dir():
        return check
    if (output / FINAL).exists() and not config.job.overwrite_output_dir:
        return Check(
            "output_dir",
            FAIL,
            f"{output} holds a finished model in {FINAL}/: the job would refuse to start",
            "choose another output_dir, or set MLM_OVERWRITE_OUTPUT_DIR=true to replace it",
        )
    complete = [c for c in checkpoints(output) if (c / COMPLETE_MARKER).exists()]
    if complete and config.job.resume == "auto":
        check.detail += f"; will resume from {complete[-1].name}"
    return check


def hf_home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


def check_cache(environ: Mapping[str, str]) -> Check:
    return check_writable(
        "cache (HF_HOME)", hf_home(environ), "mount a writable volume at the cache (HF_HOME) or point HF_HOME at one"
    )


def _offline(environ: Mapping[str, str]) -> bool:
    flags = (environ.get(name, "").lower() for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag in ("1", "true", "yes", "on") for flag in flags)


def _cached(repo_id: str, repo_type: str, environ: Mapping[str, str]) -> bool:
    """A hub repo in the local caches: the hub cache, or (datasets) our prepared-data cache."""
    hub = Path(environ.get("HF_HUB_CACHE") or hf_home(environ) / "hub")
    if (hub / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots").is_dir():
        return True
    if repo_type == "dataset":
        raw = hf_home(environ) / "mlm-trainer" / "raw"
        return (raw / repo_id.replace("/", "___")).is_dir()
    return False


def hub_info(repo_id: str, repo_type: str, timeout: float) -> None:
    """Ask the hub about a repo (raises on any failure). Separate so tests replace it."""
    import huggingface_hub

    if repo_type == "model":
        huggingface_hub.model_info(repo_id, timeout=timeout)
    else:
        huggingface_hub.dataset_info(repo_id, timeout=timeout)


def check_hub(name: str, label: str, repo_id: str, repo_type: str, environ: Mapping[str, str]) -> Check:
    cached = _cached(repo_id, repo_type, environ)
    if _offline(environ):
        if cached:
            return Check(name, OK, f"{repo_id}: offline mode, found in the cache")
        return Check(
            name,
            FAIL,
            f"{repo_id}: offline mode (HF_HUB_OFFLINE) and not in the cache ({hf_home(environ)})",
            f"fill the cache once with network access, or mount a local copy and point {label} at it",
        )
    try:
        hub_info(repo_id, repo_type, HUB_TIMEOUT_S)
    except Exception as exc:
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        if isinstance(exc, GatedRepoError):
            return Check(
                name, FAIL, f"{repo_id}: gated on the hub", "accept its terms on the hub, then set HF_TOKEN_FILE"
            )
        if isinstance(exc, RepositoryNotFoundError):
            return Check(
                name,
                FAIL,
                f"{repo_id}: not on the hub (or private)",
                f"check {label}; for a private repo set HF_TOKEN_FILE (or HF_TOKEN)",
            )
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        if cached:
            return Check(
                name,
                WARN,
                f"{repo_id}: hub unreachable ({reason}); a cached copy exists",
                "set HF_HUB_OFFLINE=1 to use the cache without trying the network",
            )
        return Check(
            name,
            FAIL,
            f"{repo_id}: hub unreachable ({reason}) and not in the cache",
            "allow access to huggingface.co (proxy: HTTPS_PROXY), or mount a local copy, or set HF_HUB_OFFLINE=1 "
            "with a filled cache",
        )
    return Check(name, OK, f"{repo_id}: reachable on the hub" + (" (also cached)" if cached else ""))


LOCAL_SUFFIXES = (".txt", ".json", ".jsonl", ".csv", ".parquet")


def _looks_local(name: str) -> bool:
    """The same rule train.data and train.model apply: a path-like name or an existing path is local."""
    return name.startswith(("/", ".", "~")) or os.path.exists(name) or Path(name).suffix.lower() in LOCAL_SUFFIXES


def check_model(config: Config, environ: Mapping[str, str], field_name: str = "model_name_or_path") -> Check:
    name = getattr(config.job, field_name)
    label = config.source_of(field_name)
    check_name = "model" if field_name == "model_name_or_path" else "tokenizer"
    if field_name == "model_name_or_path" and name.startswith("scratch:"):
        from transformers import AutoConfig

        try:
            AutoConfig.for_model(name.split(":", 1)[1])
        except ValueError:
            return Check(check_name, FAIL, f"{name}: unknown model type", f"set {label} to e.g. scratch:distilbert")
        return Check(check_name, OK, f"{name}: trained from scratch, nothing to download")
    if _looks_local(name):
        path = Path(name).expanduser()
        if path.is_file() and path.suffix == ".json":
            return Check(check_name, OK, f"{path}: a model config (trained from scratch)")
        if path.is_dir() and (path / "config.json").exists() or path.is_dir() and check_name == "tokenizer":
            return Check(check_name, OK, f"{path}: local directory")
        return Check(
            check_name,
            FAIL,
            f"{path}: no such local model directory (with a config.json)",
            f"mount the model there, or set {label} to a hub id",
        )
    return check_hub(check_name, label, name, "model", environ)


def check_dataset(config: Config, environ: Mapping[str, str]) -> Check:
    name, label = config.job.dataset, config.source_of("dataset")
    if name == "demo":
        result = Check("dataset", OK, "demo: built in")
    elif _looks_local(name):
        path = Path(name).expanduser()
        if not path.exists():
            return Check("dataset", FAIL, f"{path}: no such file or directory", f"mount the data there or fix {label}")
        if not os.access(path, os.R_OK):
            return Check("dataset", FAIL, f"{path}: not readable", "make it readable by the image's user")
        result = Check("dataset", OK, f"{path}: local {'directory' if path.is_dir() else 'file'}")
    else:
        result = check_hub("dataset", label, name, "dataset", environ)
    validation = config.job.validation_file
    if validation and not Path(validation).expanduser().exists():
        return Check(
            "dataset",
            FAIL,
            f"validation_file {validation}: no such file",
            f"mount it or fix {config.source_of('validation_file')}",
        )
    return result


# ---- NCCL all-reduce -----------------------------------------------------------------------------------------------


def _allreduce_worker(rank: int, world: int, port: int, size_mib: int, iters: int, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
    )
    try:
        # Correctness first: each rank contributes rank+1, the sum is known.
        probe = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(probe)
        expected = world * (world + 1) / 2
        if not torch.allclose(probe, torch.full_like(probe, expected)):
            raise RuntimeError(f"all-reduce returned {probe[0].item()} instead of {expected}")
        data = torch.ones(size_mib * MIB // 4, device=device, dtype=torch.float32)
        for _ in range(3):  # warm-up: NCCL sets up its channels on the first calls
            dist.all_reduce(data)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        if rank == 0:
            Path(result_path).write_text(json.dumps({"seconds": seconds}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nccl_allreduce(
    world: int, size_mib: int = 256, iters: int = 20, timeout: float = NCCL_TIMEOUT_S
) -> dict[str, float]:
    """All-reduce ``size_mib`` across ``world`` local GPUs, one process each; bus bandwidth as nccl-tests defines it.

    Raises RuntimeError (with the failing rank's error) or TimeoutError.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="mlm-doctor-") as tmp:
        result = Path(tmp) / "result.json"
        context = mp.start_processes(
            _allreduce_worker,
            args=(world, _free_port(), size_mib, iters, str(result)),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no result within {timeout:.0f} s (a hang: NCCL cannot connect the GPUs)")
        except mp.ProcessRaisedException as exc:
            last = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise RuntimeError(last[-1] if last else "a rank failed") from None
        except mp.ProcessExitedException as exc:
            raise RuntimeError(str(exc)) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        seconds = json.loads(result.read_text(encoding="utf-8"))["seconds"]
    algbw = size_mib * MIB / seconds / 1e9
    return {"seconds": seconds, "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world}


def check_nccl(torch: TorchView, run: Callable[[int], dict[str, float]] | None = None) -> Check:
    if torch.count < 2:
        return Check("nccl", SKIP, "fewer than 2 GPUs")
    fix = (
        "rerun with NCCL_DEBUG=INFO to see why; give the container IPC room (--ipc=host or a large /dev/shm); "
        "inside VMs try NCCL_P2P_DISABLE=1"
    )
    try:
        result = (run or nccl_allreduce)(torch.count)
    except (RuntimeError, TimeoutError, OSError) as exc:
        return Check("nccl", FAIL, f"all-reduce across {torch.count} GPUs failed: {exc}", fix)
    detail = f"all-reduce across {torch.count} GPUs: bus bandwidth {result['busbw_gbps']:.1f} GB/s"
    if result["busbw_gbps"] < LOW_BUSBW_GBPS:
        return Check(
            "nccl",
            WARN,
            detail + " (low: no peer-to-peer path between the GPUs?)",
            "nvidia-smi topo -m shows the links; NCCL_DEBUG=INFO shows the transport NCCL picked",
        )
    return Check("nccl", OK, detail)


# ---- multi-node ----------------------------------------------------------------------------------------------------


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if environ.get(name):
            return environ[name]
    return None


def check_master(environ: Mapping[str, str]) -> Check:
    addr = _first(environ, "MASTER_ADDR", "PET_MASTER_ADDR")
    if not addr:
        return Check("master", SKIP, "single node (no MASTER_ADDR)")
    port_text = _first(environ, "MASTER_PORT", "PET_MASTER_PORT") or "29500"
    if not port_text.isdigit():
        return Check("master", FAIL, f"MASTER_PORT={port_text!r} is not a port number", "set MASTER_PORT to a number")
    port = int(port_text)
    try:
        resolved = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        return Check(
            "master",
            FAIL,
            f"{addr} does not resolve ({exc.strerror})",
            "Kubernetes: the master is the rank-0 pod behind a headless Service (publishNotReadyAddresses: true); "
            "check its name and that it exists",
        )
    node_rank = _first(environ, "NODE_RANK", "PET_NODE_RANK", "GROUP_RANK", "JOB_COMPLETION_INDEX")
    if node_rank == "0":
        # This node hosts the rendezvous: the port must be free for torchrun to listen on.
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
            except OSError as exc:
                return Check(
                    "master",
                    WARN,
                    f"{addr} ({resolved}): this node is the master but port {port} is taken ({exc.strerror})",
                    "stop what holds it or choose another MASTER_PORT",
                )
        return Check("master", OK, f"{addr} ({resolved}): this node is the master; port {port} is free")
    try:
        with socket.create_connection((resolved, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except TimeoutError:
        return Check(
            "master",
            FAIL,
            f"{addr}:{port} ({resolved}): no answer in {CONNECT_TIMEOUT_S:.0f} s",
            "a firewall or NetworkPolicy drops the traffic; allow the port between the nodes",
        )
    except OSError as exc:
        return Check(
            "master",
            FAIL,
            f"{addr}:{port} ({resolved}): {exc.strerror or exc}",
            "start the master node (node rank 0) first: its torchrun listens there; check MASTER_PORT",
        )
    return Check("master", OK, f"{addr}:{port} ({resolved}) answers")


# ---- running and printing ------------------------------------------------------------------------------------------


def run_checks(config: Config, environ: Mapping[str, str]) -> list[Check]:
    """Every check; one that breaks unexpectedly is reported as a FAIL rather than hiding the others."""
    nvml = nvml_view()
    torch = torch_view()
    ranks = ranks_per_node(config, len(visible_gpus(nvml, environ)))
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("gpus", lambda: check_gpus(nvml, config)),
        ("driver", lambda: check_driver(nvml, torch)),
        ("torch.cuda", lambda: check_torch_cuda(nvml, torch, environ)),
        ("/dev/shm", lambda: check_shm(config, ranks)),
        ("output_dir", lambda: check_output(config)),
        ("cache (HF_HOME)", lambda: check_cache(environ)),
        ("model", lambda: check_model(config, environ)),
    ]
    if config.job.tokenizer_name:
        steps.append(("tokenizer", lambda: check_model(config, environ, "tokenizer_name")))
    steps += [
        ("dataset", lambda: check_dataset(config, environ)),
        ("nccl", lambda: check_nccl(torch)),
        ("master", lambda: check_master(environ)),
    ]
    results = []
    for name, step in steps:
        try:
            results.append(step())
        except Exception as exc:
            results.append(Check(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}", "MLM_DEBUG=1"))
    return results


COLOURS = {OK: "32", WARN: "33", FAIL: "31", SKIP: "2"}


def format_table(checks: list[Check], colour: bool = False) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'CHECK'.ljust(width)}  STATUS  DETAIL"]
    for check in checks:
        status = check.status.ljust(6)
        if colour:
            status = f"\033[{COLOURS[check.status]}m{status}\033[0m"
        lines.append(f"{check.name.ljust(width)}  {status}  {check.detail}")
        if check.fix and check.status in (WARN, FAIL):
            lines.append(f"{' ' * width}          fix: {check.fix}")
    fails = sum(c.status == FAIL for c in checks)
    warns = sum(c.status == WARN for c in checks)
    if fails:
        lines.append(f"\n{fails} FAIL, {warns} WARN: fix the FAIL rows before starting the job.")
    else:
        lines.append(f"\nNothing blocks the job ({warns} WARN).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # As in the launcher: building TrainingArguments here must not start a process group or touch a GPU.
    with as_launcher():
        config = load_config(sys.argv[1:] if argv is None else argv)
    checks = run_checks(config, os.environ)
    if config.job.log_format == "json":
        print(json.dumps({"checks": [asdict(c) for c in checks], "ok": all(c.status != FAIL for c in checks)}))
    else:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        print(format_table(checks, colour=colour))
    return EXIT_ENVIRONMENT if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
