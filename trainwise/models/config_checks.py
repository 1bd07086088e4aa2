"""A model directory's config.json checked before anything is built: a bad field is one
line naming the file, the field and what is allowed (exit 2), not an error from deep
inside transformers halfway through a build."""

from __future__ import annotations

import re
from pathlib import Path

from trainwise.common.errors import InputError

# Sizes that must be whole numbers >= 1 wherever a config has them (transformers checks
# some types but not the signs: a negative layer count or a zero vocabulary builds, then
# fails in a reshape or a len()).
SIZE_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions", "n_inner",
    "d_model", "d_ff", "d_kv", "num_layers", "num_heads", "num_decoder_layers", "encoder_layers",
    "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
)


def check_config_sizes(config, file: Path) -> None:
    """InputError naming `file` and the field when a size field is not an int >= 1 (None,
    "derive it", is allowed)."""
    values = config.to_dict()
    for field in SIZE_FIELDS:
        value = values.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{file}: {field}", f"must be an int >= 1 (got {value!r})")


def config_field_error(file: Path, error: Exception) -> InputError:
    """transformers' validation error (a field's type, or a rule between fields) as one line."""
    field = re.search(r"field '([^']+)'", str(error))
    cause = error.__cause__ or error
    text = " ".join(str(cause).split()) or type(cause).__name__
    text = re.sub(r"^Field '[^']+' ", "", text)  # the field is named once, in front
    return InputError(f"{file}: {field.group(1)}" if field else str(file), text)
