"""``python -m train.doctor [option flags]``: load the options as the launcher does, run every check, print the
rows (a table on a terminal, JSON otherwise or with ``--log_format json``) and exit 3 when one FAILs."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

from train.common.console import resolve_format
from train.common.errors import EXIT_ENVIRONMENT, exit_process, run_main
from train.common.usage import usage, wants_help
from train.config import Config
from train.doctor import machine, network, sources, storage
from train.doctor.rows import FAIL, Check, failed, render
from train.launch.plan import Plan, launcher_config
from train.machine import resources
from train.machine.gpus import detect
from train.model.memory import planned_estimate
from train.outputs.location import output_location


def run_checks(config: Config, environ: Mapping[str, str], argv: Sequence[str] = ()) -> list[Check]:
    """Every check; one that breaks unexpectedly is reported as a FAIL rather than hiding the others. It takes the
    whole Config because it assembles the checks, each handed the section it reads."""
    inventory = detect(environ)
    torch = machine.torch_view()
    shm_bytes = resources.shm_size()
    outcome = machine.plan_or_refusal(config, inventory, environ, argv, torch.cuda_build, shm_bytes)
    plan = outcome if isinstance(outcome, Plan) else None
    results: list[Check] = []
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("gpus", lambda: machine.check_gpus(inventory)),
        ("driver", lambda: machine.check_driver(inventory, torch.cuda_build)),
        ("torch.cuda", lambda: machine.check_torch_cuda(inventory, torch, environ)),
        ("/dev/shm", lambda: machine.check_shm(shm_bytes, config.training.dataloader_num_workers)),
        ("processes", lambda: machine.check_processes(outcome, results)),
        (
            "sharding",
            lambda: machine.check_sharding(
                outcome,
                config.launch.sharding,
                lambda: planned_estimate(config.model, config.training, config.data.max_seq_length),
            ),
        ),
        ("peak (MFU)", lambda: machine.check_peak(outcome, inventory, environ)),
        ("output_dir", lambda: storage.check_output(output_location(config))),
        ("cache (HF_HOME)", lambda: storage.check_cache(environ)),
        ("model", lambda: sources.check_model(config.model, environ)),
    ]
    if config.model.tokenizer_name:
        steps.append(("tokenizer", lambda: sources.check_model(config.model, environ, "tokenizer_name")))
    steps += [
        ("dataset", lambda: sources.check_dataset(config.data, environ)),
        ("nccl", lambda: network.check_nccl(torch, plan)),
        ("master", lambda: network.check_master(environ)),
    ]
    for name, step in steps:
        try:
            results.append(step())
        except Exception as exc:
            results.append(Check(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}", "MLM_DEBUG=1"))
    return results


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        print(usage("doctor"))
        return 0
    environ = os.environ if environ is None else environ
    config = launcher_config(args, environ)  # a config error ends here: exit 2 through run_main
    checks = run_checks(config, environ, args)
    log_format = resolve_format(config.launch.log_format)
    colour = log_format == "text" and sys.stdout.isatty() and not environ.get("NO_COLOR")
    print(render(checks, log_format, colour=colour))
    return EXIT_ENVIRONMENT if failed(checks) else 0


if __name__ == "__main__":
    exit_process(run_main(main))
