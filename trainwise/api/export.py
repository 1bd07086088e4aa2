"""`trainwise.api.export_checkpoint`: any trainwise checkpoint as a plain Hugging Face
directory that `from_pretrained` loads, with no process group and on one CPU.

A distributed checkpoint (torch.distributed.checkpoint shards from any layout) is read
into a model built from the config saved beside it; a one-device checkpoint already is a
Hugging Face directory and is copied. Written atomically."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from trainwise.engine.checkpoint_weights import quiet_progress_bars
from trainwise.plan.atomic import atomic_directory
from trainwise.plan.errors import InputError

_HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")


def export_checkpoint(checkpoint, out) -> Path:
    """Export `checkpoint` (a checkpoint directory, the `latest` pointer beside it, the
    checkpoints directory or the run's --output: the latter three mean the newest complete
    one) to the Hugging Face directory `out`."""
    checkpoint, out = _resolve(Path(checkpoint)), Path(out)
    info_file = checkpoint / "trainwise.json"
    if not info_file.is_file():
        raise InputError("CHECKPOINT", f"{checkpoint} is not a trainwise checkpoint (no trainwise.json); pass a "
                                       "directory such as OUTPUT/checkpoints/step-00000100, or OUTPUT")
    info = json.loads(info_file.read_text())
    if (info.get("plan") or {}).get("lora_rank"):
        raise InputError("CHECKPOINT", "LoRA checkpoints: use the run's final/ and final-adapter/ exports")
    with atomic_directory(out) as tmp:
        if (checkpoint / "dcp").is_dir():
            _from_distributed(checkpoint, tmp)
        else:
            _copy_hf_files(checkpoint, tmp)
    return out


def _resolve(path: Path) -> Path:
    from trainwise.engine.checkpoint import CHECKPOINTS, LATEST, latest_checkpoint

    if (path / "trainwise.json").is_file():
        return path
    if path.name == LATEST and path.is_file():
        output = path.parent.parent
    elif path.name == CHECKPOINTS and path.is_dir():
        output = path.parent
    else:
        output = path
    return latest_checkpoint(output) or path


def _from_distributed(checkpoint: Path, target: Path) -> None:
    import torch.distributed.checkpoint as dcp
    import transformers
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from trainwise.engine.parallel.checkpoint_shapes import fused_projections, to_checkpoint_shapes, to_model_shapes

    config_file = checkpoint / "config.json"
    if not config_file.is_file():
        raise InputError("CHECKPOINT", f"{checkpoint} has no config.json: it holds a model that is not a "
                                       "transformers model, export it from the training code")
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    architecture = (config.architectures or [None])[0]
    model_class = getattr(transformers, architecture or "", None)
    if model_class is None:
        raise InputError("CHECKPOINT", f"config.json names no transformers architecture ({architecture!r})")
    model = model_class._from_config(config)
    own = model.state_dict()
    state = {"model": to_checkpoint_shapes(own, fused_projections(model))}
    with warnings.catch_warnings(), quiet_progress_bars():
        warnings.filterwarnings("ignore", message=".*load in a single process.*")  # it is meant to be
        # Tied weights are saved under one name: the other is re-tied after loading.
        dcp.load(state, checkpoint_id=str(checkpoint / "dcp"), planner=DefaultLoadPlanner(allow_partial_load=True),
                 no_dist=True)
        model.load_state_dict(to_model_shapes(state["model"], own))
        model.tie_weights()
        model.save_pretrained(target, safe_serialization=True)


def _copy_hf_files(checkpoint: Path, target: Path) -> None:
    names = [p.name for p in checkpoint.iterdir() if p.name in _HF_FILES or p.name.startswith("model-")]
    if "config.json" not in names:
        raise InputError("CHECKPOINT", f"{checkpoint} holds no Hugging Face model files")
    for name in names:
        shutil.copy2(checkpoint / name, target / name)
