"""Where a plan is launched and what it trains: the model, data, outputs and node shape the
user gave `plan`, and the `trainwise train` line that runs the plan as shown (one node, or
one line per node across several)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan

# The port torchrun's c10d rendezvous listens on, on the first node (torchrun's own default).
RDZV_PORT = 29500
# Placeholders a per-node line leaves to the shell: the node's rank and the first node's address.
NODE_RANK = '"$NODE_RANK"'
HEAD_ENDPOINT = f'"$HEAD_NODE:{RDZV_PORT}"'


class Raw(str):
    """A word written into a command as it is (a shell variable), not quoted."""


@dataclass(frozen=True)
class Launch:
    """What `plan` was told about the run beyond the plan: the model as given (name, directory
    or module:function), its task, the data, tokenizer, steps, output directory (`--output` of
    train), checkpoint interval and restarts (None: not given), and the GPUs per node (None:
    every GPU of the plan on one node)."""

    model: str
    gpus_per_node: int | None = None
    task: str | None = None
    trust_remote_code: bool = False
    data: str | None = None
    tokenizer: str | None = None
    steps: int | None = None
    output: str | None = None
    save_every: int | None = None
    max_restarts: int | None = None


def world_size(plan: Plan) -> int:
    """Processes of the plan's layout in all (GPUs)."""
    return max(plan.nproc, plan.dp * plan.fsdp * plan.tp * plan.pp)


def node_shape(plan: Plan, launch: Launch) -> tuple[int, int]:
    """(nodes, processes per node) of `plan`; InputError when the GPUs per node do not divide it."""
    world = world_size(plan)
    per_node = min(launch.gpus_per_node or world, world)
    if world % per_node:
        raise InputError("--gpus-per-node", f"must divide the plan's {world} GPUs (got {per_node})")
    return world // per_node, per_node


def local_path(text: str | None) -> str | None:
    """An existing local file or directory as an absolute path (a launch may start in another
    directory); anything else (a catalog name, `builtin`, a glob) as given."""
    if text is None or not Path(text).exists():
        return text
    return str(Path(text).resolve())


def shell_join(words: list[str]) -> str:
    return " ".join(w if isinstance(w, Raw) else shlex.quote(w) for w in words)


def plan_words(plan: Plan, *, with_nproc: bool = True) -> list[str]:
    """`--flag value` words of the batch shape and every knob that differs from its default.
    The device is left out (train runs on the GPU that is there) unless it is the CPU."""
    words = []
    shown = {"batch_size": plan.batch_size, "grad_accum": plan.grad_accum, **plan.changed_knobs()}
    for name, value in shown.items():
        if (name == "device" and value != "cpu") or (name == "nproc" and not with_nproc):
            continue
        flag = "--" + name.replace("_", "-")
        words += [flag] if value is True else [flag, str(value)]
    return words


def run_words(launch: Launch, *, with_restarts: bool = True) -> list[str]:
    """The train flags of what the user gave: task, data, tokenizer, steps, output, restarts."""
    words = ["--task", launch.task] if launch.task else []
    if launch.trust_remote_code:
        words.append("--trust-remote-code")
    values = (("--data", local_path(launch.data)), ("--tokenizer", local_path(launch.tokenizer)),
              ("--steps", launch.steps), ("--out", launch.output), ("--save-every", launch.save_every),
              ("--max-restarts", launch.max_restarts if with_restarts else None))
    for flag, value in values:
        if value is not None:
            words += [flag, value if isinstance(value, Raw) else str(value)]
    return words


def train_words(plan: Plan, launch: Launch) -> list[str]:
    """`trainwise train MODEL ...` as words. A plan of more GPUs than one node holds gets the
    per-node line: `--nnodes N --node-rank $NODE_RANK --rdzv-endpoint $HEAD_NODE:29500
    --nproc G` (G GPUs per node), which each node runs with its own NODE_RANK."""
    nodes, per_node = node_shape(plan, launch)
    words = ["trainwise", "train", local_path(launch.model), *plan_words(plan, with_nproc=nodes == 1)]
    if nodes > 1:
        words += ["--nnodes", str(nodes), "--node-rank", Raw(NODE_RANK), "--rdzv-endpoint", Raw(HEAD_ENDPOINT),
                  "--nproc", str(per_node)]
    return words + run_words(launch)


def train_flags(plan: Plan, model: str | Launch) -> str:
    """The `trainwise train ...` line of `plan`, runnable as shown (see train_words)."""
    launch = model if isinstance(model, Launch) else Launch(model)
    return shell_join(train_words(plan, launch))
