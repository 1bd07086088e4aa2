"""Checkpoints: everything needed to continue a run exactly, written atomically.

Layout of `OUTPUT/checkpoints/`:
    step-00000042/
        config.json, model*.safetensors   the model as `save_pretrained` writes it (the
                                          directory loads with `from_pretrained`); for a LoRA
                                          run the adapter as peft writes it
                                          (`PeftModel.from_pretrained`); for a plain module
                                          `model.safetensors`
        trainer_state.pt                  optimizer, scheduler and loss-scaler state dicts and
                                          every RNG state; `torch.load(weights_only=True)` reads it
        trainwise.json                    step, data position, skipped steps, extras, plan and
                                          run settings, how the weights were saved, versions,
                                          UTC time
        manifest.json                     every other file's path, size and sha256; written
                                          last (engine/checkpoint_manifest.py)
    latest                                the name of the newest complete checkpoint

Crash safety: a checkpoint is built under a hidden temporary name and renamed into place
only when complete (trainwise.common.atomic) and verified against its manifest in place;
`latest` is replaced atomically after that; older checkpoints are pruned last. Killed at any point, a run leaves the previous good
checkpoint in place and named by `latest` (or found by the scan), and the next save clears
the leftover temporary directory.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from trainwise.engine.checkpoint_manifest import (DamagedCheckpoint, has_manifest, manifest_saved_ns,
                                                  verify_manifest, write_manifest)
from trainwise.engine.checkpoint_rng import rng_states, set_rng_states
from trainwise.engine.checkpoint_weights import prepare_weight_load, save_weights
from trainwise.common.atomic import atomic_directory, atomic_write_text
from trainwise.common.errors import InputError, first_line

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "trainwise.json"
FORMAT = 1
_NAME = re.compile(r"step-\d{8,}")
# Knobs whose change makes a checkpoint's data position or adapters mean something else.
RESUME_KNOBS = ("batch_size", "seq_len", "optim", "lora_rank", "lora_alpha", "lora_targets")


@dataclass
class TrainingState:
    """Where a run stands.

    step                    optimizer steps completed
    micro_batches_consumed  data position: the global micro-batch index to continue from
    skipped_steps           steps skipped so far (fp16 overflow, non-finite loss)
    extra                   small JSON-able extras (elapsed training seconds, last loss, ...)
    """

    step: int
    micro_batches_consumed: int
    skipped_steps: int
    extra: dict = field(default_factory=dict)


def save_checkpoint(output_dir, state: TrainingState, *, model: nn.Module, optimizer, scheduler=None,
                    scaler=None, plan=None, run=None, keep: int = 2) -> Path:
    """Write `output_dir/checkpoints/step-NNNNNNNN/`, point `latest` at it, then delete all but
    the `keep` newest complete checkpoints (keep <= 0 keeps every one). Returns its path.

    Disk: one model's weights (adapters only for LoRA) plus the optimizer state (for AdamW
    twice the trainable weights in fp32), while the previous `keep` stay. A failed write
    raises OSError (DamagedCheckpoint if it reads back wrong) and leaves the previous
    checkpoints and `latest` as they were."""
    root = Path(output_dir) / CHECKPOINTS
    path = root / f"step-{state.step:08d}"
    saved_ns = time.time_ns()
    with atomic_directory(path) as tmp:
        weights = save_weights(model, tmp)
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "rng": rng_states()}, tmp / STATE_FILE)
        info = {"format": FORMAT, "state": asdict(state), "weights": weights,
                "plan": _as_dict(plan), "run": _as_dict(run), "versions": _versions(),
                "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "saved_ns": saved_ns}
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
        write_manifest(tmp, saved_ns)
    finish_save(root, path, keep)
    return path


def finish_save(root: Path, path: Path, keep: int) -> None:
    """After `path` was renamed into place: check it against its manifest, then point
    `latest` at it, then prune (so nothing older goes before the new one is known good).
    Sizes only: the checksums were just computed from these files, and hashing them again
    would double the cost (resume checks them)."""
    verify_manifest(path, checksums=False)
    atomic_write_text(root / LATEST, path.name + "\n")
    _prune(root, keep, current=path)


def latest_checkpoint(output_dir) -> Path | None:
    """The newest complete checkpoint under `output_dir`: the one `latest` names, else the
    most recently saved complete `step-*` directory; None when there is none."""
    root = Path(output_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text(errors="replace").strip()
        if _NAME.fullmatch(name) and _complete(root / name):
            return root / name
    complete = _complete_newest_first(root)
    return complete[0] if complete else None


def resumable_checkpoint(output_dir, checksums: bool = True) -> tuple[Path | None, list[DamagedCheckpoint]]:
    """The newest checkpoint to resume from, and the newer ones passed over as damaged.

    Candidates, newest first (the one `latest` names, then by save time), are checked
    against their manifests (sizes, and sha256 with `checksums`); one without a manifest
    (older trainwise) counts when complete by the older rule. Raises InputError("--resume",
    ...) naming the bad file when every candidate is damaged; (None, []) when there is none."""
    damaged = []
    for path in _candidates_newest_first(Path(output_dir) / CHECKPOINTS):
        if not has_manifest(path):
            if _complete(path):
                return path, damaged
            continue
        try:
            verify_manifest(path, checksums=checksums)
            return path, damaged
        except DamagedCheckpoint as err:
            damaged.append(err)
    if damaged:
        bad = damaged[0]
        raise InputError("--resume", f"no intact checkpoint in {Path(output_dir) / CHECKPOINTS}: {bad.file} is "
                                     f"damaged ({bad.reason})")
    return None, damaged


def restore_checkpoint(path, *, model: nn.Module, optimizer, scheduler=None, scaler=None,
                       plan=None) -> TrainingState:
    """Load checkpoint `path` into the existing objects, in place, and return its state.

    Weights are copied into the model's own parameters (the optimizer keeps its references;
    tied weights stay tied); optimizer, scheduler and scaler state and every RNG state are
    restored. Files are read with safetensors and `torch.load(weights_only=True)` only. With
    `plan`, knobs that would change what the data position or adapters mean must match.
    Raises InputError("--resume", ...) for a missing, damaged or mismatched checkpoint."""
    path = Path(path)
    if not _complete(path):
        raise InputError("--resume", f"{path} is not a complete trainwise checkpoint")
    try:
        info = json.loads((path / INFO_FILE).read_text())
        if info.get("format") != FORMAT:
            raise ValueError(f"unknown checkpoint format {info.get('format')!r} (this trainwise reads {FORMAT})")
        _check_plan(info.get("plan"), plan)
        saved = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        copy_weights = prepare_weight_load(model, path, info["weights"])
        optimizer.load_state_dict(saved["optimizer"])
        copy_weights()
        if scheduler is not None and saved["scheduler"] is not None:
            scheduler.load_state_dict(saved["scheduler"])
        if scaler is not None and saved["scaler"] is not None:
            scaler.load_state_dict(saved["scaler"])
        set_rng_states(saved["rng"])
        return TrainingState(**info["state"])
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors, torch and json raise many kinds for damaged files
        raise InputError("--resume", f"cannot restore checkpoint {path}: {first_line(err)}") from err


def _check_plan(saved: dict | None, plan) -> None:
    current = _as_dict(plan)
    if not saved or not current:
        return
    for knob in RESUME_KNOBS:
        if knob in saved and knob in current and saved[knob] != current[knob]:
            flag = "--" + knob.replace("_", "-")
            raise InputError("--resume", f"the checkpoint was saved with {flag} {saved[knob]}, this run has "
                                         f"{current[knob]}; resume with the same value")


# ---------------------------------------------------------------------------- housekeeping
def _complete(path: Path) -> bool:
    """Renamed into place (so fully written) and holding every file; trainwise.json last."""
    return path.is_dir() and _NAME.fullmatch(path.name) is not None and \
        (path / STATE_FILE).is_file() and (path / INFO_FILE).is_file()


def _candidates_newest_first(root: Path) -> list[Path]:
    """Checkpoint directories that are complete or carry a manifest (one with a manifest
    and a file gone is damaged, not absent): the one `latest` names first."""
    if not root.is_dir():
        return []
    found = sorted((p for p in root.iterdir() if _NAME.fullmatch(p.name) and p.is_dir()
                    and (has_manifest(p) or _complete(p))), key=_saved_order, reverse=True)
    pointer = root / LATEST
    named = pointer.read_text(errors="replace").strip() if pointer.is_file() else ""
    return sorted(found, key=lambda p: p.name != named)  # stable: the rest keep their order


def _complete_newest_first(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _complete(p)), key=_saved_order, reverse=True)


def _saved_order(path: Path) -> tuple[int, str]:
    """When a checkpoint was saved (from its trainwise.json, so copies of the directory keep
    the order), then its step. By save time, a fresh run in a reused output directory
    supersedes an earlier run's checkpoints even where those reached higher steps."""
    try:
        saved_ns = int(json.loads((path / INFO_FILE).read_text()).get("saved_ns", 0))
    except (OSError, ValueError, AttributeError):
        saved_ns = manifest_saved_ns(path)
    return saved_ns, path.name


def _prune(root: Path, keep: int, current: Path) -> None:
    """Delete complete checkpoints beyond the newest `keep` (never `current`), and directories
    left by saves that were killed: only one process writes an output directory."""
    if keep > 0:
        for old in _complete_newest_first(root)[keep:]:
            if old != current:
                shutil.rmtree(old, ignore_errors=True)
    for leftover in root.glob(".step-*"):
        if leftover.is_dir() and leftover.name.endswith((".tmp", ".old")):
            shutil.rmtree(leftover, ignore_errors=True)
    for leftover in root.glob(f".{LATEST}.*.tmp"):
        leftover.unlink(missing_ok=True)


def _as_dict(value) -> dict | None:
    if value is None or isinstance(value, dict):
        return value
    return value.to_dict()


def _versions() -> dict:
    try:
        transformers_version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers_version = None
    return {"torch": torch.__version__, "transformers": transformers_version}
