"""Checks that a checkpoint can be read whole, and that an export holds the model it claims.

Both read file headers only (safetensors headers, the DCP metadata), never the weights, so
they cost milliseconds whatever the model's size:

    check_dcp_files(folder)             every shard the metadata names exists and is long
                                        enough for the byte ranges it lists
    check_safetensors_files(folder, m)  every model*.safetensors opens (its header is whole
                                        and covers the file: a truncated file fails here),
                                        and its tensors match model `m` (built from
                                        config.json, on the meta device): every name is one
                                        of the model's, with the model's shape, in the dtype
                                        config.json names or the model's own; every
                                        parameter is saved (tied copies once)

A model whose checkpoint layout transformers converts on save (e.g. fused experts) has
other names on disk than in memory: then the total number of elements is checked instead
of names and shapes. Each failure is a ValueError naming the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from trainwise.common.errors import first_line
from trainwise.engine.checkpoint_weights import saved_as_in_memory

# safetensors' dtype names (its header format) for the dtypes a model holds.
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


def check_dcp_files(folder: Path) -> None:
    """Raise ValueError naming the file when the DCP checkpoint in `folder` is not whole."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as err:  # noqa: BLE001 - a damaged pickle raises any kind
        raise ValueError(f"{folder / '.metadata'} cannot be read ({first_line(err)})") from err
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = folder / name
        if not file.is_file():
            raise ValueError(f"{file} is missing")
        if file.stat().st_size < size:
            raise ValueError(f"{file} is truncated: {file.stat().st_size} bytes, the metadata needs {size}")


def check_safetensors_files(folder: Path, model: nn.Module, config_dtype: torch.dtype | None) -> None:
    """Raise ValueError naming the file when `folder`'s model*.safetensors do not hold `model`."""
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no model*.safetensors file")
    _check_index(folder, files)
    saved = {}  # name -> (file, shape, dtype name)
    for file in files:
        saved.update({name: (file, *header) for name, header in _headers(file).items()})
    targets = model.state_dict()
    if not saved_as_in_memory(model):
        return _check_element_count(files, saved, model)
    for name, (file, shape, dtype) in saved.items():
        if name not in targets:
            raise ValueError(f"{file} holds {name}, which the model built from config.json does not have")
        expected = tuple(targets[name].shape)
        if shape != expected:
            raise ValueError(f"{file}: {name} has shape {shape}, the model's is {expected}")
        allowed = {_SAFETENSORS_DTYPES.get(targets[name].dtype), _SAFETENSORS_DTYPES.get(config_dtype)}
        if dtype not in allowed:
            raise ValueError(f"{file}: {name} is {dtype}, the model's is {' or '.join(sorted(filter(None, allowed)))}")
    missing = _unsaved_parameters(model, saved)
    if missing:
        raise ValueError(f"{files[0] if len(files) == 1 else folder} lacks {', '.join(missing[:3])}"
                         f"{' and more' if len(missing) > 3 else ''}")


def _headers(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    try:
        with safe_open(str(file), framework="pt") as handle:
            return {name: (tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype())
                    for name in handle.keys()}
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error kinds for damaged files
        raise ValueError(f"{file} is damaged or truncated ({first_line(err)})") from err


def _check_index(folder: Path, files: list[Path]) -> None:
    """A sharded model's index must name only shards that are there."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{index} cannot be read ({first_line(err)})") from err
    absent = sorted(shards - {file.name for file in files})
    if absent:
        raise ValueError(f"{folder / absent[0]} is missing (named in {index.name})")


def _unsaved_parameters(model: nn.Module, saved: dict) -> list[str]:
    """Parameters none of whose names were saved (a tied weight is saved under one name)."""
    names_of: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    return [names[0] for names in names_of.values() if not any(name in saved for name in names)]


def _check_element_count(files: list[Path], saved: dict, model: nn.Module) -> None:
    on_disk = sum(math.prod(shape) for _, shape, _ in saved.values())
    expected = sum(p.numel() for p in model.parameters())  # tied weights once
    if on_disk < expected:
        raise ValueError(f"{files[0] if len(files) == 1 else files[0].parent} holds {on_disk} weights, the model "
                         f"built from config.json has {expected}")
