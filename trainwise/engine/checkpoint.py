"""Checkpoints: everything needed to continue a run exactly, written atomically.

Layout of `OUTPUT/checkpoints/step-00000042/`:
    config.json + model.safetensors   the model, as `save_pretrained` writes it (a directory
                                      `from_pretrained` loads); a LoRA run's adapter as peft
                                      writes it; a plain module's `model.safetensors`
    trainer_state.pt                  optimizer, scheduler and loss-scaler state, and every
                                      RNG state; loadable with `torch.load(weights_only=True)`
    trainwise.json                    step, data position, plan, run settings, versions, time
`OUTPUT/checkpoints/latest` names the newest complete checkpoint. A checkpoint directory
appears only once complete (built under a temporary name, then renamed), `latest` moves
after that, and older checkpoints are pruned last: a crash at any point leaves the
previous good checkpoint usable.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_model
from torch import nn

from trainwise.plan.atomic import atomic_directory, atomic_write_text
from trainwise.plan.errors import InputError

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "trainwise.json"
PLAIN_WEIGHTS = "model.safetensors"


@dataclass
class TrainingState:
    """Where a run stands: optimizer steps done, micro-batches consumed (the data
    position), steps skipped so far, and small JSON-able extras."""

    step: int
    micro_batches_consumed: int
    skipped_steps: int
    extra: dict = field(default_factory=dict)


def save_checkpoint(output_dir, state: TrainingState, *, model: nn.Module, optimizer, scheduler=None,
                    scaler=None, plan=None, run=None, keep: int = 2) -> Path:
    """Write a checkpoint of `state` under `output_dir/checkpoints/`; returns its path."""
    root = Path(output_dir) / CHECKPOINTS
    path = root / f"step-{state.step:08d}"
    with atomic_directory(path) as tmp:
        save_weights(model, tmp)
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "rng": _rng_states()}, tmp / STATE_FILE)
        info = {"state": asdict(state), "plan": plan.to_dict() if plan is not None else None,
                "run": run.to_dict() if run is not None else None, "versions": _versions(),
                "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
    atomic_write_text(root / LATEST, path.name + "\n")
    _prune(root, keep)
    return path


def latest_checkpoint(output_dir) -> Path | None:
    """The newest complete checkpoint in `output_dir`, or None."""
    root = Path(output_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if _complete(named):
            return named
    complete = [p for p in _checkpoint_dirs(root) if _complete(p)]
    return complete[-1] if complete else None


def restore_checkpoint(path, *, model: nn.Module, optimizer, scheduler=None, scaler=None) -> TrainingState:
    """Load checkpoint `path` into the existing objects (in place) and return the state."""
    path = Path(path)
    if not _complete(path):
        raise InputError("--resume", f"{path} is not a complete trainwise checkpoint")
    try:
        load_weights(model, path)
        saved = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        info = json.loads((path / INFO_FILE).read_text())
    except Exception as err:  # noqa: BLE001 - safetensors/torch raise many kinds for damaged files
        raise InputError("--resume", f"cannot read checkpoint {path}: {str(err).splitlines()[0]}") from None
    optimizer.load_state_dict(saved["optimizer"])
    if scheduler is not None and saved["scheduler"] is not None:
        scheduler.load_state_dict(saved["scheduler"])
    if scaler is not None and saved["scaler"] is not None:
        scaler.load_state_dict(saved["scaler"])
    _set_rng_states(saved["rng"])
    return TrainingState(**info["state"])


# ---------------------------------------------------------------------------- weights
def save_weights(model: nn.Module, folder: Path) -> None:
    """The model in the form its own library loads: `save_pretrained` (transformers, peft)
    or a plain safetensors file."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, safe_serialization=True)
    else:
        save_model(model, str(folder / PLAIN_WEIGHTS))


def load_weights(model: nn.Module, folder: Path) -> None:
    """Load weights saved by `save_weights` into `model` in place."""
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
        return
    if not hasattr(model, "save_pretrained"):
        load_model(model, str(folder / PLAIN_WEIGHTS))
        return
    state = {}
    for file in sorted(folder.glob("model*.safetensors")):
        state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    untied = [key for key in missing if not _is_tied(model, key, state)]
    if untied or unexpected:
        raise ValueError(f"weights do not match the model: missing {untied[:3]}, unexpected {unexpected[:3]}")


def _is_tied(model: nn.Module, key: str, loaded: dict) -> bool:
    """A key save_pretrained left out because it shares storage with a saved one."""
    tensors = dict(model.state_dict(keep_vars=True))
    pointer = tensors[key].data_ptr()
    return any(tensors[k].data_ptr() == pointer for k in loaded if k in tensors and k != key)


def _is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


# ---------------------------------------------------------------------------- RNG
def _rng_states() -> dict:
    """Every RNG the step draws from, as tensors and plain lists (weights_only-safe)."""
    python_state = random.getstate()
    name, keys, position, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": [python_state[0], list(python_state[1]), python_state[2]],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss]}


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))


# ---------------------------------------------------------------------------- housekeeping
def _complete(path: Path) -> bool:
    return path.is_dir() and (path / STATE_FILE).is_file() and (path / INFO_FILE).is_file()


def _checkpoint_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def _prune(root: Path, keep: int) -> None:
    complete = [p for p in _checkpoint_dirs(root) if _complete(p)]
    for old in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def _versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}
