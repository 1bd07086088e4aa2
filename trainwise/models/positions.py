"""How long a sequence (in tokens) a model's position scheme allows."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from trainwise.common.errors import InputError
from trainwise.models.task_inputs import check_task_seq_len

# Families whose positions are relative buckets: any length works (memory permitting).
_RELATIVE_POSITION_FAMILIES = frozenset({"t5", "mt5", "umt5", "longt5", "switch_transformers"})
# Families that number positions from padding_idx + 1, losing pad_token_id + 1 table rows.
_PADDING_OFFSET_FAMILIES = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer"})


@dataclass(frozen=True)
class PositionLimit:
    """The longest usable sequence in tokens (None: unbounded) and why, for messages."""

    max_positions: int | None
    reason: str


def position_limit(config: PretrainedConfig) -> PositionLimit:
    """Read the position limit from a configuration, whatever the family calls it (a
    vision-language model's from its text model; Whisper's is its decoder's)."""
    config = config.get_text_config()
    if config.model_type in _RELATIVE_POSITION_FAMILIES:
        return PositionLimit(None, "relative positions")
    for field in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                  "max_target_positions"):
        table_rows = getattr(config, field, None)
        if isinstance(table_rows, int):
            break
    else:
        return PositionLimit(None, "no position limit in its config")
    field = getattr(config, "attribute_map", {}).get(field, field)  # GPT-2 says n_positions
    if config.model_type in _PADDING_OFFSET_FAMILIES:
        offset = (getattr(config, "pad_token_id", None) or 0) + 1
        return PositionLimit(table_rows - offset, f"its {field} {table_rows} minus the padding offset {offset}")
    return PositionLimit(table_rows, f"its {field}")


def check_seq_len(spec, seq_len: int) -> None:
    """Raise InputError("--seq-len", ...) unless `seq_len` tokens fit `spec`'s positions.

    `spec` is a ModelSpec. Model functions are not checked: their limits are their own.
    """
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise InputError("--seq-len", f"must be a positive whole number of tokens, got {seq_len!r}")
    if spec.config is None:
        return
    limit = position_limit(spec.config)
    if limit.max_positions is not None and seq_len > limit.max_positions:
        raise InputError("--seq-len", f"must be <= {limit.max_positions} for {spec.name} ({limit.reason})")
    check_task_seq_len(spec, seq_len)
