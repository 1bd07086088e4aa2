"""Model weights inside a checkpoint or an export: written the way the model's own library
writes them (so the directory loads with `from_pretrained`), read back into the live model
in place (the optimizer holds references to its parameters, so they must stay the same
objects).

Three kinds of model:
    transformers  `save_pretrained(safe_serialization=True)`: config.json + model*.safetensors
    peft          the adapter directory as peft writes it (adapter_config.json +
                  adapter_model.safetensors); the frozen base weights are not saved, only a
                  fingerprint of them, checked on restore
    safetensors   any other nn.Module: model.safetensors (`safetensors.torch.save_model`)

transformers 5 may save some models (Mixtral's fused experts, for example) in a different
key layout from the one they hold in memory; such checkpoints are read back through
`from_pretrained` into a temporary CPU copy, the others straight from the safetensors files.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_model
from torch import nn

PLAIN_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
FINGERPRINT_REL_TOL = 1e-9  # reduction order may differ between devices; real changes are far larger
_FINGERPRINT_CHUNK = 1 << 24  # elements upcast to float64 at a time (128 MiB)


def unwrap(model: nn.Module) -> nn.Module:
    """The module that owns the weights, seen through torch.compile and DDP wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def weights_kind(model: nn.Module) -> str:
    if is_peft(model):
        return "peft"
    return "transformers" if hasattr(model, "save_pretrained") else "safetensors"


def save_weights(model: nn.Module, folder: Path) -> dict:
    """Write `model`'s weights into `folder`; returns what restoring needs to know (JSON-able)."""
    model = unwrap(model)
    kind = weights_kind(model)
    if kind == "safetensors":
        save_model(model, str(folder / PLAIN_WEIGHTS))
    else:
        with quiet_progress_bars():
            model.save_pretrained(folder, safe_serialization=True)
    info = {"kind": kind}
    if kind == "transformers":
        info["layout"] = "as-in-memory" if saved_as_in_memory(model) else "converted"
    if kind == "peft":
        info["frozen_fingerprint"] = frozen_fingerprint(model)
    return info


def prepare_weight_load(model: nn.Module, folder: Path, info: dict) -> Callable[[], None]:
    """Read and check the weights in `folder` against `model` without changing it; returns
    the function that copies them in. Raises ValueError when they do not fit."""
    model = unwrap(model)
    kind = weights_kind(model)
    if info.get("kind") != kind:
        raise ValueError(f"it holds a {info.get('kind')} model, this run has a {kind} model")
    if kind == "safetensors":
        return lambda: _load_plain(model, folder)
    if kind == "peft":
        return _prepare_adapter_load(model, folder, info)
    if info.get("layout") == "as-in-memory":
        return _prepare_direct_load(model, folder)
    return _prepare_from_pretrained_load(model, folder)


def frozen_fingerprint(model: nn.Module) -> list[float]:
    """Sum and sum of squares (float64) of the frozen parameters: a LoRA checkpoint stores
    only adapters, so resuming is exact only on the same base weights."""
    total, squares = 0.0, 0.0
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                continue
            for chunk in param.detach().reshape(-1).split(_FINGERPRINT_CHUNK):
                chunk = chunk.double()
                total += chunk.sum().item()
                squares += chunk.square().sum().item()
    return [total, squares]


@contextlib.contextmanager
def quiet_progress_bars():
    """transformers draws a progress bar per save; a training log does not want it."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------- loaders
def _load_plain(model: nn.Module, folder: Path) -> None:
    missing, unexpected = load_model(model, str(folder / PLAIN_WEIGHTS), strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")


def _prepare_adapter_load(model: nn.Module, folder: Path, info: dict) -> Callable[[], None]:
    from peft import set_peft_model_state_dict

    saved, current = info.get("frozen_fingerprint"), frozen_fingerprint(model)
    if saved is None or not all(math.isclose(a, b, rel_tol=FINGERPRINT_REL_TOL, abs_tol=1e-6)
                                for a, b in zip(saved, current)):
        raise ValueError("the base model's frozen weights differ from those the LoRA adapters were trained "
                         "on (resume with the same model and --seed)")
    adapter = load_file(str(folder / ADAPTER_WEIGHTS))

    def apply() -> None:
        result = set_peft_model_state_dict(model, adapter)
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        missing = sorted(trainable & set(result.missing_keys))
        if missing or result.unexpected_keys:
            raise ValueError(f"adapter does not match the model: missing {missing[:3]}, "
                             f"unexpected {list(result.unexpected_keys)[:3]}")
    return apply


def _prepare_direct_load(model: nn.Module, folder: Path) -> Callable[[], None]:
    """Check names and shapes from the safetensors headers; copy tensor by tensor (no full
    second copy of the weights in memory)."""
    targets = model.state_dict()
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ValueError("no model*.safetensors file")
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key not in targets:
                    raise ValueError(f"weights do not match the model: unexpected {key}")
                shape = tuple(handle.get_slice(key).get_shape())
                if shape != tuple(targets[key].shape):
                    raise ValueError(f"{key} has shape {shape}, the model's is {tuple(targets[key].shape)}")
                where[key] = file
    missing = _missing_parameters(model, targets, where)
    if missing:
        raise ValueError(f"weights do not match the model: missing {missing[:3]}")

    def apply() -> None:
        with torch.no_grad():
            for file in files:
                with safe_open(str(file), framework="pt") as handle:
                    for key in handle.keys():
                        targets[key].copy_(handle.get_tensor(key))
    return apply


def _missing_parameters(model: nn.Module, targets: dict, saved) -> list[str]:
    """Model entries the files lack, other than tied copies (save_pretrained writes a shared
    tensor once) and buffers (rebuilt by the model itself, e.g. position ids)."""
    saved_storage = {targets[k].data_ptr() for k in saved}
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return [k for k in targets if k not in saved and k in parameters and targets[k].data_ptr() not in saved_storage]


def _prepare_from_pretrained_load(model: nn.Module, folder: Path) -> Callable[[], None]:
    """A layout transformers converts on load: let `from_pretrained` convert it into a CPU
    copy (costs host memory for one copy of the weights, upcast losslessly to the widest
    floating dtype in the model), then copy into the live model."""
    widest = max((p.dtype for p in model.parameters() if p.is_floating_point()),
                 key=lambda dtype: torch.finfo(dtype).bits, default=torch.float32)
    with quiet_progress_bars():
        loaded = type(model).from_pretrained(folder, dtype=widest, attn_implementation="eager")
    state = loaded.state_dict()
    targets = model.state_dict()
    wrong = sorted(set(state) ^ set(targets))
    wrong += [k for k in state if k in targets and state[k].shape != targets[k].shape]
    if wrong:
        raise ValueError(f"weights do not match the model: {wrong[:3]}")

    def apply() -> None:
        with torch.no_grad():
            for key, tensor in state.items():
                targets[key].copy_(tensor)
    return apply


def saved_as_in_memory(model: nn.Module) -> bool:
    """Whether save_pretrained wrote the state-dict keys unchanged: no weight conversion is
    registered for the model. Asks transformers' own conversion table (the one save_pretrained
    reverses); where that API is missing, assumes a conversion (the slower, safe path)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange
    except ImportError:
        return False
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        try:
            conversions = get_model_conversion_mapping(model, add_legacy=False)
        except Exception:  # noqa: BLE001 - an internal API; any failure means "do not know"
            return False
        conversions = [c for c in conversions if not isinstance(c, PrefixChange)]
    return not conversions
