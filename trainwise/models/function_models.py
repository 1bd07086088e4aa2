"""Models given as ``package.module:function`` returning ``(model, batch)``.

The function is called as ``fn(batch_size=..., seq_len=...)`` with whichever of those
keywords it accepts. It returns an ``nn.Module`` and one micro-batch (a dict of tensors
or one tensor); ``model(**batch)`` (or ``model(batch)``) must return a loss tensor or an
object with ``.loss``.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, Callable

import torch
from torch import nn

from trainwise.common.errors import InputError

OFFERED_KEYWORDS = ("batch_size", "seq_len")
_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def looks_like_function_reference(name: str) -> bool:
    """True for strings shaped like ``package.module:function``."""
    return bool(_REFERENCE.match(name.strip()))


def import_model_function(reference: str) -> Callable[..., Any]:
    """Import the function named by ``package.module:function``; InputError if that fails."""
    module_name, function_name = reference.strip().split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError("MODEL", f"cannot import module '{module_name}' for '{reference}': {error}") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InputError("MODEL", f"module '{module_name}' has no function '{function_name}'")
    check_signature(function, reference)
    return function


def check_signature(function: Callable[..., Any], reference: str) -> None:
    """InputError naming the function when it needs an argument trainwise does not pass:
    it is called with only `batch_size` and `seq_len` (as keywords), so found now rather
    than as a TypeError once the run has started."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): its call will tell
    needed = [p.name for p in parameters if p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in OFFERED_KEYWORDS]
    if needed:
        raise InputError("MODEL", f"{reference} requires {', '.join(repr(n) for n in needed)}, but a model function "
                                  f"is called with only the keywords {' and '.join(OFFERED_KEYWORDS)} (give the "
                                  "others defaults)")


def call_model_function(
    function: Callable[..., Any], batch_size: int, seq_len: int, device: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, torch.Tensor] | torch.Tensor]:
    """Call a model function under `device` as the default device; check what it returns."""
    parameters = inspect.signature(function).parameters
    takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    offered = dict(zip(OFFERED_KEYWORDS, (batch_size, seq_len)))
    kwargs = {key: value for key, value in offered.items() if takes_any_keyword or key in parameters}
    with torch.device(device):
        result = function(**kwargs)
    return _checked_result(function, result)


def _checked_result(function: Callable[..., Any], result: Any):
    name = getattr(function, "__qualname__", repr(function))
    if not (isinstance(result, tuple) and len(result) == 2):
        raise InputError("MODEL", f"{name} must return (model, batch), got {type(result).__name__}")
    model, batch = result
    if not isinstance(model, nn.Module):
        raise InputError("MODEL", f"{name} must return an nn.Module first, got {type(model).__name__}")
    tensors = batch.values() if isinstance(batch, dict) else [batch]
    if not all(isinstance(tensor, torch.Tensor) for tensor in tensors):
        raise InputError("MODEL", f"{name} must return a tensor or a dict of tensors as its batch")
    return model, batch
