"""Give a meta-device model fake storage, so a real training step can run without memory."""

from __future__ import annotations

import torch
from torch import nn


def materialize_fake(model: nn.Module, device: str | torch.device = "cpu") -> nn.Module:
    """Replace every meta parameter and buffer with an uninitialised tensor on `device`.

    Call inside a FakeTensorMode: the tensors are then fake (shape, dtype, device only).
    Tied weights stay tied because each distinct tensor is converted once."""
    converted: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[name] = _convert(param, device, converted, as_parameter=True)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = _convert(buffer, device, converted, as_parameter=False)
    return model


def _convert(tensor, device, converted, as_parameter):
    key = id(tensor)
    if key not in converted:
        empty = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
        converted[key] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if as_parameter else empty
    return converted[key]
