"""`trainwise.api.export_checkpoint`: any trainwise checkpoint as a plain Hugging Face
directory that `from_pretrained` loads, with no process group and on one CPU.

A distributed checkpoint (torch.distributed.checkpoint shards from any layout) is read
into a model built from the config saved beside it; a one-device checkpoint already is a
Hugging Face directory and is copied. Before anything is written, the source is checked
(every file it needs is there and whole) and the destination must lie outside it; the
written files' headers are read back and matched against the model built from
config.json before the directory is put in place (atomically: trainwise.common.atomic)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from trainwise.engine.checkpoint_weights import quiet_progress_bars
from trainwise.common.atomic import atomic_directory, check_replaceable
from trainwise.common.errors import InputError, first_line
from trainwise.models.quiet import quiet_transformers

_HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")


def export_checkpoint(checkpoint, out) -> Path:
    """Export `checkpoint` (a checkpoint directory, the `latest` pointer beside it, the
    checkpoints directory or the run's --out: the latter three mean the newest complete
    one) to the Hugging Face directory `out`."""
    given, out = Path(checkpoint), Path(out)
    checkpoint = _resolve(given)
    info_file = checkpoint / "trainwise.json"
    if not info_file.is_file():
        raise InputError("CHECKPOINT", f"{checkpoint} is not a trainwise checkpoint (no trainwise.json); pass a "
                                       "directory such as OUTPUT/checkpoints/step-00000100, or OUTPUT")
    info = json.loads(info_file.read_text())
    if (info.get("plan") or {}).get("lora_rank"):
        raise InputError("CHECKPOINT", "LoRA checkpoints: use the run's final/ and final-adapter/ exports")
    _check_apart(out, [checkpoint, _run_directory(given)])
    check_replaceable(out, "--out")
    model, dtype = _model_from_config(checkpoint)
    distributed = (checkpoint / "dcp").is_dir()
    _check_source(checkpoint, model, dtype, distributed)
    with atomic_directory(out, "--out") as tmp:
        if distributed:
            _from_distributed(checkpoint, tmp)
        else:
            _copy_hf_files(checkpoint, tmp)
        _check_written(tmp, out, model, dtype)
        _copy_tokenizer(run_tokenizer(checkpoint), tmp)
    return out


def run_tokenizer(checkpoint) -> Path | None:
    """The tokenizer directory the checkpoint's run trained with (`--tokenizer`, recorded in
    its trainwise.json), or None for byte tokens."""
    info_file = _resolve(Path(checkpoint)) / "trainwise.json"
    recorded = (json.loads(info_file.read_text()).get("run") or {}).get("tokenizer") if info_file.is_file() else None
    return Path(recorded).expanduser() if recorded else None


def _copy_tokenizer(directory: Path | None, target: Path) -> None:
    """The run's tokenizer saved beside the model, so the export loads as a pair; a tokenizer
    directory that is gone since the run is left out (the command says so)."""
    if directory is None or not directory.is_dir():
        return
    from trainwise.engine.data.tokens import LocalTokenizer

    LocalTokenizer(str(directory)).hf_tokenizer.save_pretrained(target)


def _resolve(path: Path) -> Path:
    from trainwise.engine.checkpoint import latest_checkpoint

    if (path / "trainwise.json").is_file():
        return path
    return latest_checkpoint(_run_directory(path)) or path


def _run_directory(path: Path) -> Path:
    """The run's --out that CHECKPOINT names or lies in (itself when it is neither)."""
    from trainwise.engine.checkpoint import CHECKPOINTS, LATEST

    if path.name == LATEST and path.is_file():
        return path.parent.parent
    if path.name == CHECKPOINTS and path.is_dir():
        return path.parent
    if path.parent.name == CHECKPOINTS and (path / "trainwise.json").is_file():
        return path.parent.parent
    return path


def _check_apart(out: Path, sources: list[Path]) -> None:
    """Writing `out` must not touch the checkpoint or its run: refuse an `out` that is,
    contains or lies inside either (real paths, so symlinks count as what they name)."""
    target = out.resolve()
    overlaps = []
    for source in sources:
        real = source.resolve()
        relation = ("is" if target == real else "lies inside" if target.is_relative_to(real)
                    else "contains" if real.is_relative_to(target) else None)
        if relation:
            overlaps.append((relation != "is", relation, source))  # "is" says it most plainly
    if overlaps:
        _, relation, source = min(overlaps, key=lambda overlap: overlap[0])
        raise InputError("--out", f"{out} {relation} the source {source}; export to a directory outside it")
    for folder in (target, *target.parents):
        if (folder / "trainwise.json").is_file() or (folder.name == "checkpoints" and (folder / "latest").is_file()):
            raise InputError("--out", f"{out} is or lies inside a run's checkpoints ({folder}); export to a "
                                      "directory outside it")


def _model_from_config(checkpoint: Path):
    """The model config.json describes, on the meta device (no memory, no initialisation),
    and the dtype config.json names."""
    import torch
    import transformers

    config_file = checkpoint / "config.json"
    if not config_file.is_file():
        raise InputError("CHECKPOINT", f"{checkpoint} has no config.json: it holds a model that is not a "
                                       "transformers model, export it from the training code")
    try:
        with quiet_transformers():  # its complaints about the config would precede our one line
            config = transformers.AutoConfig.from_pretrained(checkpoint)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds for a bad config
        raise InputError("CHECKPOINT", f"{config_file} cannot be read: {first_line(err)}") from err
    architecture = (config.architectures or [None])[0]
    model_class = getattr(transformers, architecture or "", None)
    if model_class is None:
        raise InputError("CHECKPOINT", f"config.json names no transformers architecture ({architecture!r})")
    dtype = getattr(config, "dtype", None)
    with torch.device("meta"):
        model = model_class._from_config(config, dtype=dtype if isinstance(dtype, torch.dtype) else None)
    return model, dtype if isinstance(dtype, torch.dtype) else None


def _check_source(checkpoint: Path, model, dtype, distributed: bool) -> None:
    from trainwise.engine.export_check import check_dcp_files, check_safetensors_files

    try:
        if distributed:
            check_dcp_files(checkpoint / "dcp")
        else:
            check_safetensors_files(checkpoint, model, dtype)
    except ValueError as err:
        raise InputError("CHECKPOINT", f"{err}; nothing was written") from err


def _check_written(folder: Path, out: Path, model, dtype) -> None:
    from trainwise.engine.export_check import check_safetensors_files

    try:
        check_safetensors_files(folder, model, dtype)
    except ValueError as err:  # a failed write: not the user's doing, so not exit 2
        reason = str(err).replace(str(folder), str(out))  # the temporary name means nothing to the user
        raise RuntimeError(f"the export to {out} did not read back ({reason}); {out} was left as it was") from err


def _from_distributed(checkpoint: Path, target: Path) -> None:
    import torch.distributed.checkpoint as dcp
    import transformers
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from trainwise.engine.parallel.checkpoint_shapes import fused_projections, to_checkpoint_shapes, to_model_shapes

    config = transformers.AutoConfig.from_pretrained(checkpoint)
    model = getattr(transformers, config.architectures[0])._from_config(config)
    own = model.state_dict()
    state = {"model": to_checkpoint_shapes(own, fused_projections(model))}
    with warnings.catch_warnings(), quiet_progress_bars():
        warnings.filterwarnings("ignore", message=".*load in a single process.*")  # it is meant to be
        # Tied weights are saved under one name: the other is re-tied after loading.
        try:
            dcp.load(state, checkpoint_id=str(checkpoint / "dcp"),
                     planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
        except Exception as err:  # noqa: BLE001 - a shard damaged inside its byte ranges
            raise InputError("CHECKPOINT", f"{checkpoint / 'dcp'} cannot be read ({first_line(err)}); nothing "
                                           "was written") from err
        model.load_state_dict(to_model_shapes(state["model"], own))
        model.tie_weights()
        model.save_pretrained(target, safe_serialization=True)


def _copy_hf_files(checkpoint: Path, target: Path) -> None:
    names = [p.name for p in checkpoint.iterdir() if p.name in _HF_FILES or p.name.startswith("model-")]
    if "config.json" not in names:
        raise InputError("CHECKPOINT", f"{checkpoint} holds no Hugging Face model files")
    for name in names:
        shutil.copy2(checkpoint / name, target / name)
