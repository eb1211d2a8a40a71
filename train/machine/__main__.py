"""``python -m train.machine [--json]`` (``entrypoint.sh gpus``): the GPUs this process may use, as the launcher
sees them, and the driver check."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from train.common.errors import ConfigError, exit_process, run_main
from train.common.usage import usage, wants_help
from train.machine.gpus import Gpu, Inventory, check_driver, detect, format_cuda_version, torch_cuda_version


def _row(position: int, gpu: Gpu) -> tuple[str, ...]:
    memory, capability = f"{gpu.memory_total_bytes / 2**30:.1f} GiB", "{}.{}".format(*gpu.compute_capability)
    return (str(position), str(gpu.index), gpu.name, memory, capability, "yes" if gpu.mig_mode else "no", gpu.uuid)


def format_table(inventory: Inventory) -> str:
    """The inventory as a table a person reads (``entrypoint.sh gpus``)."""
    lines = []
    if inventory.gpus:
        rows: list[tuple[str, ...]] = [("cuda", "nvml", "name", "memory", "cc", "mig", "uuid")]
        rows += [_row(position, gpu) for position, gpu in enumerate(inventory.gpus)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
    else:
        lines.append(f"no GPU visible: CPU mode ({inventory.cpu_reason})")
    if inventory.driver_version:
        lines.append(
            f"driver {inventory.driver_version}, CUDA {format_cuda_version(inventory.cuda_driver_version)}; "
            f"NVML lists {inventory.nvml_device_count} device(s)"
        )
    lines += [f"note: {note}" for note in inventory.notes if inventory.gpus or note != inventory.cpu_reason]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the inventory; exit 3 when the driver is too old."""
    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        print(usage("gpus"))
        return 0
    unknown = [arg for arg in args if arg != "--json"]
    if unknown:
        raise ConfigError(f"gpus {unknown[0]}: unknown argument; {usage('gpus').splitlines()[0]}")
    inventory = detect()
    torch_cuda = torch_cuda_version()
    warning = check_driver(inventory, torch_cuda)
    if "--json" in args:
        print(json.dumps({**inventory.as_dict(), "torch_cuda": torch_cuda, "driver_warning": warning}, indent=2))
    else:
        print(format_table(inventory))
        if warning:
            print(f"warning: {warning}")
    return 0


if __name__ == "__main__":
    exit_process(run_main(main))
