"""A plan as a bash script that starts `trainwise train` under torchrun: one node
(`--standalone`), several nodes (the same script on each, torchrun's c10d rendezvous on the
first), or a Slurm batch script (`srun` starts one torchrun per node). trainwise itself
expresses every knob, so these targets drop nothing."""

from __future__ import annotations

import dataclasses
import shlex

from trainwise.plan.plan import Plan
from trainwise.emit.targets import cannot_express_comments, comments
from trainwise.emit.train_line import RDZV_PORT, Launch, Raw, node_shape, plan_words, run_words, shell_join

# Restarts the Slurm script gives torchrun when `plan` was not told --max-restarts: a failed
# process (a lost node, a NCCL timeout) restarts the job from its newest checkpoint.
SLURM_RESTARTS = 3
# Seconds before the time limit Slurm sends SIGTERM: one optimizer step and a checkpoint save.
SLURM_STOP_S = 120
# Seconds torchrun waits for its workers after that signal before it kills them (its default
# is 30 s, often too short for a large model's step and save): the lead less a margin.
SHUTDOWN_S = SLURM_STOP_S - 10


def _trainwise_words(plan: Plan, launch: Launch) -> list[str]:
    """`-m trainwise train ...` under a torchrun started by the script: torchrun sets the
    world size and restarts the workers itself, so neither --nproc nor --max-restarts is given."""
    return ["-m", "trainwise", "train", launch.model, *plan_words(plan, with_nproc=False),
            *run_words(launch, with_restarts=False)]


def _restarts(restarts: int | None) -> list[str]:
    return ["--max-restarts", str(restarts)] if restarts else []


def torchrun_script(plan: Plan, launch: Launch) -> tuple[str, list[str]]:
    """A bash script: `torchrun --standalone` on one node; across N nodes, run on each node
    with HEAD_NODE set to the first node's address (c10d assigns the node ranks)."""
    nodes, per_node = node_shape(plan, launch)
    if nodes == 1:
        words = ["torchrun", "--standalone", "--nproc-per-node", str(per_node)]
        how = [f"trainwise plan for {launch.model}: one node, {per_node} processes"]
    else:
        words = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", Raw(f'"$HEAD_NODE:{RDZV_PORT}"'), "--rdzv-id", "trainwise"]
        how = [f"trainwise plan for {launch.model}: {nodes} nodes x {per_node} GPUs.",
               "Run this script on every node at about the same time, with HEAD_NODE set to the first node's "
               "address:", "  HEAD_NODE=node0.example bash THIS_FILE",
               "torchrun's c10d rendezvous on HEAD_NODE gives each node its rank."]
    body = shell_join(words + _restarts(launch.max_restarts) + _trainwise_words(plan, launch))
    guard = ': "${HEAD_NODE:?set HEAD_NODE to the address of the first node}"\n' if nodes > 1 else ""
    text = "#!/bin/bash\n" + comments(how) + cannot_express_comments([]) + "set -euo pipefail\n" + guard + body
    return text, []


def slurm_script(plan: Plan, launch: Launch) -> tuple[str, list[str]]:
    """An sbatch script: one task per node, each a torchrun of `trainwise train` that meets the
    others through c10d on the first host of the allocation."""
    nodes, per_node = node_shape(plan, launch)
    restarts = SLURM_RESTARTS if launch.max_restarts is None else launch.max_restarts
    output = shlex.quote(launch.output) if launch.output else '"$SLURM_SUBMIT_DIR/trainwise-out"'
    words = ["srun", "--kill-on-bad-exit=1", "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
             "--rdzv-backend", "c10d", "--rdzv-endpoint", Raw('"$HEAD_NODE:$RDZV_PORT"'),
             "--rdzv-id", Raw('"$SLURM_JOB_ID"'), *_restarts(restarts)]
    train = _trainwise_words(plan, dataclasses.replace(launch, output=Raw('"$OUTPUT"')))
    sbatch = ["#SBATCH --job-name=trainwise", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
              f"#SBATCH --gpus-per-node={per_node}", f"#SBATCH --signal=TERM@{SLURM_STOP_S}"]
    notes = [f"trainwise plan for {launch.model}: {nodes} nodes x {per_node} GPUs. Submit with `sbatch THIS_FILE`;",
             "add the --partition, --account and --time your cluster needs, and activate the environment",
             "that has trainwise and torchrun (the job inherits the submitting shell's PATH by default).",
             f"--signal: {SLURM_STOP_S} s before the time limit Slurm sends SIGTERM to the job step's processes",
             "(not to this batch shell): trainwise's ranks finish the step, save a checkpoint in --out and exit.",
             f"torchrun waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT ({SHUTDOWN_S} s) for them before it kills them (a torchrun",
             "that does not read it, in older torch, waits 30 s: the step and the save must fit in that).",
             f"torchrun restarts a failed job up to {restarts} times"
             + (" (plan --max-restarts)" if launch.max_restarts is not None else " (the script's default)")
             + "; it continues from the newest checkpoint in --out"
             + ("." if launch.save_every else " (without plan --save-every: saved only at the end or on SIGTERM)."),
             "OUTPUT (checkpoints and the final model) and the data must be on storage every node shares."
             + ("" if launch.output else " Default: the submit directory (plan --train-out DIR sets it).")]
    lines = ["#!/bin/bash", *sbatch, comments(notes) + cannot_express_comments([]).rstrip("\n"),
             "set -euo pipefail", f"OUTPUT={output}", f"export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={SHUTDOWN_S}",
             'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             f'RDZV_PORT="${{RDZV_PORT:-{RDZV_PORT}}}"', shell_join(words + train)]
    return "\n".join(lines), []
