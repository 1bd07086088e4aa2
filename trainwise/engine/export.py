"""The trained model as directories other tools load.

    OUTPUT/final/           the full model: `AutoModel*.from_pretrained` loads it (config.json +
                            model*.safetensors, and the tokenizer when given); for a LoRA run
                            the adapters merged into the base weights
    OUTPUT/final-adapter/   LoRA runs only: the adapters alone (`PeftModel.from_pretrained`)

A model that is not a transformers/peft model gets `final/model.safetensors`
(`safetensors.torch.load_model` loads it). Each directory is written atomically.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

from torch import nn

from trainwise.engine.checkpoint_weights import is_peft, quiet_progress_bars, save_weights, unwrap
from trainwise.common.atomic import atomic_directory


def export_final(output_dir, model: nn.Module, *, tokenizer=None) -> dict[str, Path]:
    """Write `output_dir/final/` (and `final-adapter/` for LoRA); returns {label: path}.

    For LoRA the merge runs on a copy of the model in host memory, so the training model
    keeps its adapters and no device memory is needed: the export costs host memory for one
    copy of all weights in their training dtype (e.g. 2 bytes per parameter under bf16-pure),
    freed on return."""
    output_dir = Path(output_dir)
    model = unwrap(model)
    exports: dict[str, Path] = {}
    if is_peft(model):
        adapter = output_dir / "final-adapter"
        with atomic_directory(adapter) as tmp, quiet_progress_bars():
            model.save_pretrained(tmp, safe_serialization=True)
            save_tokenizer(tokenizer, tmp)
        exports["LoRA adapter"] = adapter
        model = host_copy(model).merge_and_unload()
    final = output_dir / "final"
    with atomic_directory(final) as tmp:
        save_weights(model, tmp)
        save_tokenizer(tokenizer, tmp)
    exports["final model (LoRA merged)" if exports else "final model"] = final
    return exports


def host_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` whose parameters and buffers live on the CPU, made without a
    second copy on the model's device (each tensor is copied straight to the host; tied
    weights stay tied because the copy is keyed by tensor identity)."""
    memo: dict[int, object] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if id(tensor) in memo:
            continue
        host = tensor.detach().to("cpu", copy=True)
        memo[id(tensor)] = nn.Parameter(host, requires_grad=tensor.requires_grad) \
            if isinstance(tensor, nn.Parameter) else host
    return copy.deepcopy(model, memo)


def save_tokenizer(tokenizer, folder: Path) -> None:
    """The run's tokenizer beside its model (None: the run read byte tokens, there is none)."""
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(folder)
