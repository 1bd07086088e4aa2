"""RunConfig: how a training run is driven (data, length, outputs), as opposed to the Plan,
which says how each step is computed. Declared with the same `knob()` metadata as the
Plan, so its flags and validation are generated the same way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainwise.plan.knobs import KnobSpec, knob, knob_specs
from trainwise.plan.plan import validated_values

ON_NAN = ("stop", "skip")
EVAL_PRECISIONS = ("same", "fp32", "fp16", "bf16")


@dataclass(frozen=True)
class RunConfig:
    """Everything about a run that is not a per-step knob."""

    data: str = knob("builtin", "training data: builtin (a small text corpus shipped with trainwise, "
                                "byte tokens), synthetic (random inputs for any task), a .txt/.jsonl/.csv/.parquet file, a "
                                "directory or glob of them, a save_to_disk directory, or for an image classifier a "
                                "folder of class subfolders of images", group="data")
    synthetic_batches: int = knob(0, "with --data synthetic: draw only the first N micro-batches and repeat them "
                                     "(a check that the model can fit a fixed set: the loss must fall); 0: every "
                                     "micro-batch new", minimum=0, group="data")
    tokenizer: str | None = knob(None, "local Hugging Face tokenizer directory (for file data; "
                                       "default: byte tokens)", optional=True, kind=str, group="data")
    tokenize_workers: int = knob(0, "processes that tokenize --data files, once: the ids are cached, memory-mapped "
                                    "(0: one per core up to 8 above 64 MB of text, else 1)", minimum=0, group="data")
    text_field: str = knob("text", "field holding the text in .jsonl/.csv/.parquet/saved data", group="data")
    data_split: str = knob("train", "split of a DatasetDict saved with save_to_disk", group="data")
    chat: str | None = knob(None, "train on conversations: FIELD holds a list of {role, content} messages, formatted "
                                  "with --tokenizer's chat template; the loss covers the assistant turns only",
                            optional=True, kind=str, group="data")
    steps: int = knob(100, "optimizer steps to run", minimum=1, group="run and output")
    output: str | None = knob(None, "directory for checkpoints and the final model", optional=True, kind=str,
                              group="run and output", flag="out", aliases=("--output",))
    save_every: int = knob(0, "save a checkpoint every N steps (0: only at the end)", minimum=0, group="run and output")
    resume: bool = knob(False, "continue from the latest good checkpoint in --out", group="run and output")
    # Off by default: an asynchronous save holds a host-memory copy of each rank's shards
    # while it writes, which no preflight checks (a synchronous save writes from the tensors).
    checkpoint_async: bool = knob(False, "with --nproc: write --save-every checkpoints in the background while "
                                         "training goes on (one in flight at a time; each rank holds a copy of its "
                                         "shards in host memory until written); the last save is synchronous",
                                  group="run and output")
    max_restarts: int = knob(0, "with --nproc (and --nnodes): restart the whole job up to N times when a "
                                "process fails, continuing from the newest checkpoint in --out", minimum=0,
                             group="run and output")
    nnodes: int = knob(1, "nodes of the job, each running `trainwise train` with the same flags and its own "
                          "--node-rank; --nproc is per node (1: this node alone, no rendezvous)", minimum=1,
                       group="parallel layout")
    node_rank: int = knob(0, "with --nnodes N: this node's number, 0 to N-1", minimum=0, group="parallel layout")
    rdzv_endpoint: str | None = knob(None, "with --nnodes N: HOST:PORT of torchrun's c10d rendezvous, the same on "
                                           "every node (e.g. the first node's address)", optional=True, kind=str,
                                     group="parallel layout")
    rdzv_id: str | None = knob(None, "with --nnodes N: the job's rendezvous id, the same on every node (default: "
                                     "derived from the command line, which every node shares)", optional=True, kind=str,
                               group="parallel layout")
    seed: int = knob(0, "random seed (model init, data order, dropout)", minimum=0, group="run and output")
    metrics: str | None = knob(None, "write per-step metrics as JSON lines to this file", optional=True, kind=str, group="run and output")
    log_every: int = knob(1, "log metrics every N steps", minimum=1, group="run and output")
    report_to: str = knob("none", "dashboards that also get the metrics: none, tensorboard, wandb, or several "
                                  "comma-separated (wandb stays offline unless you configured it)", group="run and output")
    no_chart: bool = knob(False, "do not write the loss and throughput chart (PNG beside --metrics)", group="run and output")
    report_dir: str | None = knob(None, "where dashboards write (default: runs/ under --out, else beside "
                                        "--metrics)", optional=True, kind=str, group="run and output")
    timing_warmup: int | None = knob(None, "steps excluded from the throughput summary "
                                           "(default: 1, or 2 with a --compile-mode other than default); "
                                           "steps that compiled are always excluded (compile_s)", optional=True, kind=int, minimum=0, group="run and output")
    on_nan: str = knob("stop", "when the loss is NaN/inf: stop with a diagnosis, or skip the step", choices=ON_NAN, group="run and output")
    eval_every: int = knob(0, "evaluate on held-out batches every N steps (0: never)", minimum=0, group="run and output")
    eval_batches: int = knob(4, "micro-batches per evaluation", minimum=1, group="run and output")
    eval_precision: str = knob("same", "evaluation precision: same as training, or full fp32/fp16/bf16 weights",
                               choices=EVAL_PRECISIONS, group="run and output")
    deterministic: bool = knob(False, "deterministic kernels (exact resume checks; slower)", group="run and output")

    @classmethod
    def specs(cls) -> tuple[KnobSpec, ...]:
        return knob_specs(cls)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "run") -> "RunConfig":
        return cls(**validated_values(cls.specs(), values, source, "setting"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "RunConfig":
        return RunConfig.from_dict({**self.to_dict(), **changes})
