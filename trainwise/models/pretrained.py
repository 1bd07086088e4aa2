"""Load a local Hugging Face model directory *with* its weights, for fine-tuning.

`build_model` always initialises at random (it is also used on the meta device); a
directory that holds weights is loaded with `from_pretrained` instead, safetensors only
unless the directory has nothing else, and never running remote code unless allowed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trainwise.models.build import ATTENTION_IMPLEMENTATIONS, _attention_implementation
from trainwise.models.spec import ModelSpec
from trainwise.models.tasks import auto_class

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def has_weights(spec: ModelSpec) -> bool:
    """True for a local directory that ships safetensors weights."""
    if spec.source != "directory":
        return False
    folder = Path(spec.name).expanduser()
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def load_pretrained(spec: ModelSpec, device: torch.device, attention: str = "sdpa") -> tuple[nn.Module, tuple[str, ...]]:
    """The model of directory `spec` with its trained weights on `device` (fp32), and notes.

    Weights the task head adds (a new classification head, say) are initialised at random
    by transformers, which warns about them."""
    implementation, notes = _attention_implementation(spec, attention, device)
    assert implementation in ATTENTION_IMPLEMENTATIONS.values()
    model = auto_class(spec.task).from_pretrained(
        str(Path(spec.name).expanduser()), config=spec.config, dtype=torch.float32,
        attn_implementation=implementation, trust_remote_code=spec.trust_remote_code,
        use_safetensors=True,
    )
    return model.to(device), notes
