"""Checkpoints of distributed runs, with torch.distributed.checkpoint (DCP).

Same place and crash safety as one-device checkpoints (engine/checkpoint.py):

    OUTPUT/checkpoints/step-00000042/
        dcp/                 model and optimizer, written by every rank in parallel; keyed
                             by the unsharded model's parameter names, so it loads under
                             another layout or world size (ZeRO-3 on 4 ranks -> TP x DP on 2
                             -> one process): DCP reshards on load
        config.json          the model's config (for `trainwise export`)
        trainer_state.pt     scheduler, loss scaler, every rank's RNG states (rank 0 writes)
        trainwise.json       step, data position, plan, layout, versions
        manifest.json        every file's path, size and sha256 (rank 0, after every rank's
                             shards are written); last
    OUTPUT/checkpoints/latest

Rank 0 creates the hidden temporary directory, every rank writes its shards into it, and
rank 0 renames it into place only after all have finished (a barrier), so a job killed
mid-save leaves the previous checkpoint as the latest. The directory must be on a
filesystem every node sees. A save is begun (begin_distributed_save: the directory and the
side files), its shards written (dcp.save here, dcp.async_save in async_checkpoint.py),
then finished (finish_distributed_save: the manifest, the rename, `latest`).

ZeRO-1's optimizer (ZeroRedundancyOptimizer) is not a DCP-aware optimizer: its state is
consolidated on rank 0 into trainer_state.pt, and resumes under ZeRO-1 at any world size.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.optim import ZeroRedundancyOptimizer

from trainwise.engine.checkpoint import (CHECKPOINTS, FORMAT, INFO_FILE, STATE_FILE, TrainingState, _check_plan,
                                         _complete, _versions, finish_save)
from trainwise.engine.checkpoint_manifest import write_manifest
from trainwise.engine.checkpoint_rng import rng_states, set_rng_states
from trainwise.engine.checkpoint_weights import unwrap
from trainwise.engine.export import save_tokenizer
from trainwise.engine.parallel.checkpoint_shapes import (fused_projections, to_checkpoint_shapes, to_model_shapes,
                                                        to_transformers_shapes)
from trainwise.common.atomic import atomic_directory
from trainwise.common.errors import InputError

DCP_FOLDER = "dcp"
CONFIG_FILE = "config.json"


@dataclass
class SaveInProgress:
    """A distributed checkpoint whose side files are written (rank 0) and whose shards are
    being written: `staging` is rank 0's open temporary directory (None on other ranks),
    renamed into place by finish_distributed_save."""

    path: Path
    tmp: Path
    staging: object | None
    saved_ns: int
    keep: int


def save_distributed_checkpoint(output, state: TrainingState, *, setup, plan, run, keep: int = 2) -> Path:
    """Write the checkpoint of step `state.step` (called on every rank); returns its path."""
    save, shards = begin_distributed_save(output, state, setup=setup, plan=plan, run=run, keep=keep)
    try:
        dcp.save(shards, checkpoint_id=str(save.tmp / DCP_FOLDER))
    except BaseException as err:
        abandon_distributed_save(save, err)
        raise
    return finish_distributed_save(save)


def begin_distributed_save(output, state: TrainingState, *, setup, plan, run, keep: int) -> tuple[SaveInProgress, dict]:
    """Open the checkpoint's temporary directory, write its side files (rank 0) and return
    it with this rank's shards, to be written into tmp/dcp by dcp.save or dcp.async_save."""
    distributed = setup.distributed
    path = Path(output) / CHECKPOINTS / f"step-{state.step:08d}"
    staging, tmp = None, None
    saved_ns = time.time_ns()
    if distributed.is_main:
        staging = atomic_directory(path)
        tmp = staging.__enter__()
    save = SaveInProgress(path, Path(_from_rank_zero(str(tmp) if tmp else None)), staging, saved_ns, keep)
    try:
        model_state, optimizer_state = _state_dicts(setup)
        consolidated = _zero_one_state(setup)
        rngs = [None] * distributed.world
        dist.all_gather_object(rngs, rng_states())
        if distributed.is_main:
            _write_side_files(save.tmp, state, setup, plan, run, consolidated, rngs, saved_ns)
    except BaseException as err:
        abandon_distributed_save(save, err)
        raise
    return save, {"model": model_state, **({"optimizer": optimizer_state} if optimizer_state else {})}


def finish_distributed_save(save: SaveInProgress) -> Path:
    """After this rank's shards are written: wait for every rank's, then rank 0 writes the
    manifest (last), renames the directory into place and points `latest` at it."""
    try:
        dist.barrier()  # every rank's shards are on disk
        if save.staging is not None:
            write_manifest(save.tmp, save.saved_ns)
    except BaseException as err:
        abandon_distributed_save(save, err)
        raise
    if save.staging is not None:
        save.staging.__exit__(None, None, None)
        finish_save(save.path.parent, save.path, save.keep)
    dist.barrier()  # nobody goes on (or ends) before the checkpoint is in place
    return save.path


def abandon_distributed_save(save: SaveInProgress, err: BaseException) -> None:
    """Remove the temporary directory of a save that failed (rank 0); the latest checkpoint stays."""
    if save.staging is not None:
        save.staging.__exit__(type(err), err, err.__traceback__)


def _write_side_files(tmp: Path, state: TrainingState, setup, plan, run, consolidated, rngs, saved_ns: int) -> None:
    torch.save({"scheduler": setup.scheduler.state_dict(), "scaler": setup.scaler.state_dict(),
                "rng": rngs, "zero1_optimizer": consolidated}, tmp / STATE_FILE)
    config = getattr(unwrap(_first_part(setup.model)), "config", None)
    if config is not None:
        (tmp / CONFIG_FILE).write_text(config.to_json_string())
    distributed = setup.distributed
    info = {"format": FORMAT, "state": asdict(state), "weights": {"kind": "dcp"},
            "plan": plan.to_dict(), "run": run.to_dict(), "world": distributed.world,
            "data_parallel": distributed.layout.data_parallel,
            "layout": distributed.layout.describe(), "versions": _versions(),
            "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "saved_ns": saved_ns}
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))


def load_distributed_checkpoint(path, *, setup, plan) -> TrainingState:
    """Load checkpoint `path` into this rank's shards (any layout it was saved under)."""
    path = Path(path)
    if not _complete(path) or not (path / DCP_FOLDER).is_dir():
        raise InputError("--resume", f"{path} is not a complete distributed trainwise checkpoint "
                                     "(one-device checkpoints resume without --nproc)")
    info = json.loads((path / INFO_FILE).read_text())
    _check_plan(info.get("plan"), plan)
    model_state, optimizer_state = _state_dicts(setup, form="model")
    if (info.get("plan") or {}).get("zero") == 1:
        optimizer_state = None
    wanted = {"model": _in_checkpoint_form(setup, model_state, loading=True)}
    if optimizer_state:
        own_groups = copy.deepcopy(optimizer_state["param_groups"])  # dcp.load overwrites them in place
        wanted["optimizer"] = {**optimizer_state, "state": _in_checkpoint_form(setup, optimizer_state["state"],
                                                                                loading=True)}
    dcp.load(wanted, checkpoint_id=str(path / DCP_FOLDER))
    wanted["model"] = _in_model_form(setup, wanted["model"], model_state)
    if "optimizer" in wanted:
        wanted["optimizer"]["state"] = _in_model_form(setup, wanted["optimizer"]["state"], optimizer_state["state"])
        wanted["optimizer"]["param_groups"] = _own_parameter_names(setup.model, wanted["optimizer"], own_groups)
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


def export_from_distributed(output, checkpoint: Path, setup, tokenizer=None) -> dict:
    """OUTPUT/final/ as a Hugging Face directory, gathered from the shards (every rank
    takes part in the gather; rank 0 writes), with the run's tokenizer beside it."""
    full = get_model_state_dict(setup.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    final = Path(output) / "final"
    if setup.distributed.is_main:
        model = unwrap(_first_part(setup.model))
        if not hasattr(model, "save_pretrained") or setup.pipeline is not None:
            dist.barrier()
            return {}  # pipeline stages hold parts of the model: `trainwise export CHECKPOINT` writes it whole
        full = to_transformers_shapes(full, fused_projections(model))  # tensor parallel holds some per part
        with atomic_directory(final) as tmp:
            model.save_pretrained(tmp, state_dict=full, safe_serialization=True)
            save_tokenizer(tokenizer, tmp)
    dist.barrier()
    return {"final model" if not hasattr(unwrap(setup.model), "peft_config") else "LoRA adapter": final}


def _state_dicts(setup, form: str = "checkpoint") -> tuple[dict, dict | None]:
    """Model and optimizer state, keyed by parameter name, as this rank's shards: in the
    names and shapes the checkpoint stores (form "checkpoint") or the model's own."""
    model_state = get_model_state_dict(setup.model)
    optimizer_state = (None if isinstance(setup.optimizer, ZeroRedundancyOptimizer)
                       else get_optimizer_state_dict(setup.model, setup.optimizer))
    if form == "model":
        return model_state, optimizer_state
    if optimizer_state is not None:
        optimizer_state = {**optimizer_state, "state": _in_checkpoint_form(setup, optimizer_state["state"])}
    return _in_checkpoint_form(setup, model_state), optimizer_state


def _in_checkpoint_form(setup, state: dict, loading: bool = False) -> dict:
    """`state` (parameter name -> tensors) under the checkpoint's names and shapes. A rank
    running two pipeline stages (interleaved 1F1B) holds them in a ModuleList whose names
    start with the stage's index: dropped. Loading, the last stage's copy of a head tied
    to the embedding reads the embedding's entries, which every layout saves (the head's
    own name has no optimizer state where the two are one parameter)."""
    fused = fused_projections(unwrap(_first_part(setup.model)))
    names = _checkpoint_names(setup, loading)
    return {names(name): value for name, value in to_checkpoint_shapes(state, fused).items()}


def _in_model_form(setup, loaded: dict, model_state: dict) -> dict:
    """The inverse of _in_checkpoint_form(..., loading=True), keyed like `model_state`."""
    names = _checkpoint_names(setup, loading=True)
    by_checkpoint_name = {names(name): name for name in model_state}
    return to_model_shapes({by_checkpoint_name[name]: value for name, value in loaded.items()}, model_state)


def _own_parameter_names(model: nn.Module, loaded: dict, own: list[dict]) -> list[dict]:
    """The saved parameter groups' settings (learning rate and the like) with this rank's
    parameter names: the saved names are one rank's, and under pipeline parallel that
    rank's stage may hold another part of the model. A weight with two names (a tied
    head) is listed under the name its loaded state has: set_optimizer_state_dict wants
    state for whichever name the groups list, and torch's own state dict of an FSDP2
    model lists the head's name while keying the state by the embedding's."""
    aliases: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    alias_of = {name: names for names in aliases.values() for name in names}

    def with_state(name: str) -> str:
        return next((alias for alias in alias_of.get(name, [name]) if alias in loaded["state"]), name)

    groups = own if len(loaded["param_groups"]) != len(own) else loaded["param_groups"]
    return [{**saved, "params": [with_state(name) for name in mine["params"]]} for saved, mine in zip(groups, own)]


def _checkpoint_names(setup, loading: bool):
    prefixed = setup.pipeline is not None and len(setup.pipeline.stages) > 1  # a ModuleList: "0.", "1." first
    tied = {}
    if loading and setup.pipeline is not None:
        for stage in setup.pipeline.stages:
            if stage.is_last and stage.tied_weight() is not None:
                tied[stage.parts.last[-1] + ".weight"] = stage.parts.first[0] + ".weight"

    def name(key: str) -> str:
        key = key.split(".", 1)[1] if prefixed else key
        return tied.get(key, key)
    return name


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
