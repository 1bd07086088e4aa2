"""Before any long work: can the run's output directory be written, and does it have room?

`train --out DIR` writes checkpoints and final/ only at the end of the run (or every
--save-every steps), and `bench --out DIR` writes its results after the first row: a
directory that cannot take them would otherwise be found out only after the work is done,
and the run lost. So both check first (nothing is created or removed by the check):

    DIR exists and is a directory, or its nearest existing parent is a directory; that
    directory is writable by this process (a read-only filesystem or mode counts; as root a
    mode does not, as root can write there), and no file stands where a directory must go;
    final/ and final-adapter/, if present, are directories trainwise may replace
    (trainwise.common.atomic); the filesystem has room for what the run will write.
    Without --resume, DIR holds no earlier run (no checkpoints/, final/ or final-adapter/):
    a new run would replace that run's final/ and leave its checkpoints beside the new
    ones, where --resume and export would later take them for this run's.

Room a training run needs (bytes; simple plan arithmetic, not a trace):

    weights     parameters x bytes per weight (4: fp32, tf32, and the fp32 master weights of
                fp16/bf16 mixed precision; 2 under bf16-pure)
    optimizer   trainable parameters x state per parameter: AdamW 2 moments and SGD 1
                (momentum), each in the weights' dtype; adamw-8bit 2 bytes; Adafactor's
                factored state (row and column vectors) counted as 0
    checkpoint  weights + optimizer; a LoRA checkpoint holds only the adapters, counted as 0
    at once     a checkpoint is written before the oldest kept one is pruned, so up to
                KEPT_CHECKPOINTS + 1 are on disk: min(saves in the run, that)
    exports     final/: the weights once (for LoRA the merged model)
    need        (checkpoints at once x checkpoint + exports) x MARGIN + SLACK_BYTES

A model whose parameters cannot be counted without running it (a `module:function` model
that cannot be built on the meta device) gets the writability checks only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trainwise.common.atomic import check_replaceable
from trainwise.common.errors import InputError
from trainwise.common.units import human_bytes

KEPT_CHECKPOINTS = 2  # save_checkpoint's `keep`, which the training loop leaves at its default
MARGIN = 1.10  # headers, config and tokenizer files, filesystem blocks
SLACK_BYTES = 16 * 1024**2  # trainer state (RNG, scheduler), metrics, small files
BENCH_RESULTS_BYTES = 16 * 1024**2  # results.json, .csv, .md and chart.png of a long ladder
_OPTIMIZER_STATES = {"adamw": 2.0, "adamw-fused": 2.0, "sgd": 1.0, "adafactor": 0.0}
_ADAMW_8BIT_BYTES = 2.0
RUN_RESULTS = ("checkpoints", "final", "final-adapter")  # what a run leaves in --out


def check_output_directory(flag: str, path, need_bytes: int | None) -> None:
    """Raise InputError(flag, ...) unless `path` can be a writable directory with
    `need_bytes` free on its filesystem (None: room is not checked)."""
    path = Path(path)
    existing = _nearest_existing(path.absolute())
    if not existing.is_dir():
        what = "is a file" if existing == path.absolute() else f"lies under {existing}, which is a file"
        raise InputError(flag, f"{path} {what}, not a directory; name a directory (it is created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        problem = "is read-only" if existing == path.absolute() else f"cannot be created: {existing} is read-only"
        raise InputError(flag, f"{path} {problem} to this process; name a directory it can write")
    if need_bytes is not None:
        free = shutil.disk_usage(existing).free
        if free < need_bytes:
            raise InputError(flag, f"{path} has too little room: need {human_bytes(need_bytes)}, "
                                   f"{human_bytes(free)} free on its filesystem")


def check_training_output(output, plan, run, parameters: int | None) -> None:
    """The checks above for `train --out`, with the room a run of `plan` and `run` needs
    for a model of `parameters` parameters; also final/ must be replaceable."""
    if not output:
        return
    need = None if parameters is None else training_output_bytes(parameters, plan, run)
    check_output_directory("--out", output, need)
    for name in ("final", "final-adapter"):
        check_replaceable(Path(output) / name, "--out")
    if not run.resume:
        check_unused(output)


def check_unused(output) -> None:
    """InputError(--out) when `output` holds an earlier run's results (see the module docstring).
    A worker restarted by torchrun continues its own job there, and is not asked."""
    from trainwise.engine.parallel.restarts import restart_attempt

    found = [name for name in RUN_RESULTS if (Path(output) / name).exists()]
    if found and restart_attempt() == 0:
        raise InputError("--out", f"{output} already holds a run ({', '.join(f + '/' for f in found)}); "
                                  "add --resume to continue it, or name a fresh folder; nothing was replaced")


def training_output_bytes(parameters: int, plan, run) -> int:
    """Bytes a run writes to --out at most at once (see the module docstring)."""
    weight_bytes = 2 if plan.precision == "bf16-pure" else 4
    weights = parameters * weight_bytes
    if plan.optim == "adamw-8bit":
        optimizer = parameters * _ADAMW_8BIT_BYTES
    else:
        optimizer = parameters * weight_bytes * _OPTIMIZER_STATES.get(plan.optim, 2.0)
    checkpoint = 0 if plan.lora_rank else weights + optimizer
    saves = (run.steps - 1) // run.save_every + 1 if run.save_every else 1
    at_once = min(saves, KEPT_CHECKPOINTS + 1)
    return int((at_once * checkpoint + weights) * MARGIN) + SLACK_BYTES


def count_parameters_of(spec_or_module) -> int | None:
    """Parameters of a ModelSpec (built on the meta device: no memory, no initialisation)
    or of a built nn.Module; None when the model cannot be built that way."""
    from torch import nn

    from trainwise.models.build import build_model, count_parameters

    if isinstance(spec_or_module, nn.Module):
        return count_parameters(spec_or_module)
    if spec_or_module is None:
        return None
    try:
        return count_parameters(build_model(spec_or_module, device="meta"))
    except Exception:  # noqa: BLE001 - a user's model function may not support meta; room is then unchecked
        return None


def _nearest_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (a file among them stops the walk)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor)
