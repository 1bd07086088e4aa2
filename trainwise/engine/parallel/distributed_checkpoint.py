"""Checkpoints of distributed runs, with torch.distributed.checkpoint (DCP).

Same place and crash safety as one-device checkpoints (engine/checkpoint.py):

    OUTPUT/checkpoints/step-00000042/
        dcp/                 model and optimizer, written by every rank in parallel; keyed
                             by the unsharded model's parameter names, so it loads under
                             another layout or world size (ZeRO-3 on 4 ranks -> TP x DP on 2
                             -> one process): DCP reshards on load
        config.json          the model's config (for `trainwise export`)
        trainer_state.pt     scheduler, loss scaler, every rank's RNG states (rank 0 writes)
        trainwise.json       step, data position, plan, layout, versions; written last
    OUTPUT/checkpoints/latest

Rank 0 creates the hidden temporary directory, every rank writes its shards into it, and
rank 0 renames it into place only after all have finished (a barrier), so a job killed
mid-save leaves the previous checkpoint as the latest. The directory must be on a
filesystem every node sees.

ZeRO-1's optimizer (ZeroRedundancyOptimizer) is not a DCP-aware optimizer: its state is
consolidated on rank 0 into trainer_state.pt, and resumes under ZeRO-1 at any world size.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.optim import ZeroRedundancyOptimizer

from trainwise.engine.checkpoint import (CHECKPOINTS, FORMAT, INFO_FILE, LATEST, STATE_FILE, TrainingState,
                                         _check_plan, _complete, _prune, _versions)
from trainwise.engine.parallel.checkpoint_shapes import (fused_projections, to_checkpoint_shapes, to_model_shapes,
                                                        to_transformers_shapes)
from trainwise.engine.checkpoint_rng import rng_states, set_rng_states
from trainwise.engine.checkpoint_weights import unwrap
from trainwise.plan.atomic import atomic_directory, atomic_write_text
from trainwise.plan.errors import InputError

DCP_FOLDER = "dcp"
CONFIG_FILE = "config.json"


def save_distributed_checkpoint(output, state: TrainingState, *, setup, plan, run, keep: int = 2) -> Path:
    """Write the checkpoint of step `state.step` (called on every rank); returns its path."""
    distributed = setup.distributed
    root = Path(output) / CHECKPOINTS
    path = root / f"step-{state.step:08d}"
    staging, tmp = None, None
    if distributed.is_main:
        staging = atomic_directory(path)
        tmp = staging.__enter__()
    tmp = Path(_from_rank_zero(str(tmp) if tmp else None))
    try:
        model_state, optimizer_state = _state_dicts(setup)
        dcp.save({"model": model_state, **({"optimizer": optimizer_state} if optimizer_state else {})},
                 checkpoint_id=str(tmp / DCP_FOLDER))
        consolidated = _zero_one_state(setup)
        rngs = [None] * distributed.world
        dist.all_gather_object(rngs, rng_states())
        if distributed.is_main:
            torch.save({"scheduler": setup.scheduler.state_dict(), "scaler": setup.scaler.state_dict(),
                        "rng": rngs, "zero1_optimizer": consolidated}, tmp / STATE_FILE)
            config = getattr(unwrap(_first_part(setup.model)), "config", None)
            if config is not None:
                (tmp / CONFIG_FILE).write_text(config.to_json_string())
            info = {"format": FORMAT, "state": asdict(state), "weights": {"kind": "dcp"},
                    "plan": plan.to_dict(), "run": run.to_dict(), "world": distributed.world,
                    "data_parallel": distributed.layout.data_parallel,
                    "layout": distributed.layout.describe(), "versions": _versions(),
                    "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "saved_ns": time.time_ns()}
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
    except BaseException as err:
        if staging is not None:
            staging.__exit__(type(err), err, err.__traceback__)
        raise
    dist.barrier()  # every rank's shards are on disk
    if staging is not None:
        staging.__exit__(None, None, None)
        atomic_write_text(root / LATEST, path.name + "\n")
        _prune(root, keep, current=path)
    dist.barrier()  # nobody goes on (or ends) before the checkpoint is in place
    return path


def load_distributed_checkpoint(path, *, setup, plan) -> TrainingState:
    """Load checkpoint `path` into this rank's shards (any layout it was saved under)."""
    path = Path(path)
    if not _complete(path) or not (path / DCP_FOLDER).is_dir():
        raise InputError("--resume", f"{path} is not a complete distributed trainwise checkpoint "
                                     "(one-device checkpoints resume without --nproc)")
    info = json.loads((path / INFO_FILE).read_text())
    _check_plan(info.get("plan"), plan)
    model_state, optimizer_state = _state_dicts(setup, shapes="model")
    fused = fused_projections(unwrap(_first_part(setup.model)))
    saved_zero_one = (info.get("plan") or {}).get("zero") == 1
    wanted = {"model": to_checkpoint_shapes(model_state, fused)}
    if optimizer_state and not saved_zero_one:
        wanted["optimizer"] = {**optimizer_state, "state": to_checkpoint_shapes(optimizer_state["state"], fused)}
    dcp.load(wanted, checkpoint_id=str(path / DCP_FOLDER))
    wanted["model"] = to_model_shapes(wanted["model"], model_state)
    if "optimizer" in wanted:
        wanted["optimizer"]["state"] = to_model_shapes(wanted["optimizer"]["state"], optimizer_state["state"])
    options = StateDictOptions(strict=True)
    set_model_state_dict(setup.model, wanted["model"], options=options)
    saved = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    if isinstance(setup.optimizer, ZeroRedundancyOptimizer):
        if saved.get("zero1_optimizer") is None:
            raise InputError("--resume", "this checkpoint's optimizer was sharded by parameter name; resume it "
                                         "with --zero 2 or 3, DDP, --tp or one process, not --zero 1")
        setup.optimizer.load_state_dict(saved["zero1_optimizer"])
    elif "optimizer" in wanted:
        set_optimizer_state_dict(setup.model, setup.optimizer, wanted["optimizer"])
    else:
        raise InputError("--resume", "this checkpoint was saved under --zero 1, whose optimizer state only "
                                     "ZeRO-1 can read; resume with --zero 1")
    setup.scheduler.load_state_dict(saved["scheduler"])
    setup.scaler.load_state_dict(saved["scaler"])
    rngs = saved["rng"]
    # The same world size continues every rank's random stream exactly; another layout
    # gives each rank rank 0's streams (data order does not depend on them).
    set_rng_states(rngs[setup.distributed.rank] if len(rngs) == setup.distributed.world else rngs[0])
    state = TrainingState(**info["state"])
    # The data position counts micro-batches per data-parallel rank; under another number
    # of data-parallel ranks the same global position is another per-rank count.
    before, now = info.get("data_parallel", 1), setup.distributed.layout.data_parallel
    if before != now:
        if (state.micro_batches_consumed * before) % now:
            raise InputError("--resume", f"the checkpoint's data position ({state.micro_batches_consumed} micro-"
                                         f"batches on each of {before} data-parallel ranks) cannot be split over {now}")
        state.micro_batches_consumed = state.micro_batches_consumed * before // now
    return state


def export_from_distributed(output, checkpoint: Path, setup) -> dict:
    """OUTPUT/final/ as a Hugging Face directory, gathered from the shards (every rank
    takes part in the gather; rank 0 writes)."""
    full = get_model_state_dict(setup.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    final = Path(output) / "final"
    if setup.distributed.is_main:
        model = unwrap(_first_part(setup.model))
        full = to_transformers_shapes(full, fused_projections(model))  # tensor parallel holds some per part
        if not hasattr(model, "save_pretrained") or setup.pipeline is not None:
            dist.barrier()
            return {}  # pipeline stages hold parts of the model: `trainwise export CHECKPOINT` writes it whole
        with atomic_directory(final) as tmp:
            model.save_pretrained(tmp, state_dict=full, safe_serialization=True)
    dist.barrier()
    return {"final model" if not hasattr(unwrap(setup.model), "peft_config") else "LoRA adapter": final}


def _state_dicts(setup, shapes: str = "checkpoint") -> tuple[dict, dict | None]:
    """Model and optimizer state, keyed by parameter name, as this rank's shards: in the
    shapes the checkpoint stores (checkpoint_shapes.py) or the model's own."""
    model_state = get_model_state_dict(setup.model)
    optimizer_state = (None if isinstance(setup.optimizer, ZeroRedundancyOptimizer)
                       else get_optimizer_state_dict(setup.model, setup.optimizer))
    if shapes == "model":
        return model_state, optimizer_state
    fused = fused_projections(unwrap(_first_part(setup.model)))
    if optimizer_state is not None:
        optimizer_state = {**optimizer_state, "state": to_checkpoint_shapes(optimizer_state["state"], fused)}
    return to_checkpoint_shapes(model_state, fused), optimizer_state


def _zero_one_state(setup) -> dict | None:
    if not isinstance(setup.optimizer, ZeroRedundancyOptimizer):
        return None
    setup.optimizer.consolidate_state_dict(to=0)  # a collective: every rank sends its share
    return setup.optimizer.state_dict() if setup.distributed.is_main else None


def _first_part(model: nn.Module) -> nn.Module:
    return model[0] if isinstance(model, nn.ModuleList) else model


def _from_rank_zero(value):
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
