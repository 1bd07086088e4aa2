"""Tables for `trainwise env`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainwise.api.environment import OPTIONAL_PACKAGES, Environment
from trainwise.hardware.topology import PATH_MEANING
from trainwise.common.units import human_bytes


def render_environment(env: Environment, console: Console | None = None) -> None:
    console = console or Console()
    host = human_bytes(env.host_memory_bytes) if env.host_memory_bytes else "unknown"
    console.print(f"Python {env.python}, torch {env.torch}, CUDA {env.cuda or 'none (CPU build)'}, "
                  f"cuDNN {env.cudnn or 'none'}, NCCL {env.nccl or 'none'}; distributed backends: "
                  f"{', '.join(env.distributed_backends) or 'none'}", highlight=False)
    console.print(f"CPU: {env.cpu_cores} cores usable, {host} memory (read from the OS)", highlight=False)
    if not env.gpus:
        console.print(env.gpu_note, highlight=False)
    else:
        console.print(_gpu_table(env))
        if env.links:
            console.print(_link_table(env))
            console.print("Links: " + "; ".join(f"{k}: {v}" for k, v in PATH_MEANING.items()), highlight=False)
        elif len(env.gpus) > 1:
            console.print("Links between GPUs: unknown (NVML not available)", highlight=False)
    console.print(_package_table(env))


def _gpu_table(env: Environment) -> Table:
    table = Table(title="GPUs (read from the driver)", title_justify="left")
    for column in ("#", "name", "memory", "compute capability", "bf16", "tf32", "catalog entry (peak FLOP/s)"):
        table.add_column(column)
    for gpu in env.gpus:
        table.add_row(str(gpu.index), gpu.name, human_bytes(gpu.memory_bytes), gpu.compute_capability,
                      _yes(gpu.bf16), _yes(gpu.tf32), gpu.catalog or "not in catalog: no MFU")
    return table


def _link_table(env: Environment) -> Table:
    table = Table(title="GPU links (as nvidia-smi topo -m)", title_justify="left")
    table.add_column("")
    for gpu in env.gpus:
        table.add_column(f"GPU{gpu.index}")
    for gpu, row in zip(env.gpus, env.links):
        table.add_row(f"GPU{gpu.index}", *[cell or "X" for cell in row])
    return table


def _package_table(env: Environment) -> Table:
    table = Table(title="Optional packages", title_justify="left")
    for column in ("package", "version", "used for"):
        table.add_column(column)
    for name, version in env.packages.items():
        table.add_row(name, version or "not installed", OPTIONAL_PACKAGES[name])
    return table


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
