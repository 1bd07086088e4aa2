"""The trained model as a directory other tools load: `from_pretrained` for the full model;
for a LoRA run also the adapter alone (`PeftModel.from_pretrained`)."""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from trainwise.engine.checkpoint import _is_peft, save_weights
from trainwise.plan.atomic import atomic_directory


def export_final(output_dir, model: nn.Module, *, tokenizer=None) -> dict[str, Path]:
    """Write `output_dir/final/` (and `final-adapter/` for LoRA); returns {label: path}.

    A LoRA model's adapters are merged into the base weights on a copy of the model, so
    the export briefly needs the model's weight memory once more; the training model
    keeps its adapters."""
    output_dir = Path(output_dir)
    exports = {}
    if _is_peft(model):
        adapter = output_dir / "final-adapter"
        with atomic_directory(adapter) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
        exports["LoRA adapter"] = adapter
        model = copy.deepcopy(model).merge_and_unload()
    final = output_dir / "final"
    with atomic_directory(final) as tmp:
        save_weights(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    exports["final model" + (" (LoRA merged)" if "LoRA adapter" in exports else "")] = final
    return exports
