"""What reading another tool's training configuration found: the Plan knobs it gave, and for
every setting that matters to one step's memory or time, whether it was mapped exactly,
mapped approximately (and how), or ignored (and why).

The readers (`from_training_args.py`, `from_deepspeed.py`, `from_accelerate.py`) fill one
`Reading` per file; `foreign_config.py` merges them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainwise.common.errors import InputError

EXACT, APPROXIMATE, IGNORED = "exact", "approximate", "ignored"


@dataclass(frozen=True)
class Setting:
    """One setting of a foreign file: `key` as the file spells it (dotted for nested keys),
    `value` as found, `knob`/`knob_value` what it became (None when ignored), `how` one of
    exact/approximate/ignored, `note` why (empty for an exact mapping)."""

    source: str
    key: str
    value: Any
    knob: str | None
    knob_value: Any
    how: str
    note: str = ""

    def to_json(self) -> dict:
        return {"file": self.source, "setting": self.key, "value": self.value, "knob": self.knob,
                "knob_value": self.knob_value, "how": self.how, "note": self.note}


@dataclass
class Reading:
    """The knobs one file gives and the settings behind them. `world_size` and
    `gpus_per_node` are what the file says about the launch (None when it does not);
    `data_parallel` is "replicate" (DDP) or "shard" (ZeRO/FSDP) when the file spreads the
    model over GPUs, set by the setting named in `data_parallel_key` (the degree is the world
    size, from this file, another one or --nproc)."""

    source: str
    kind: str
    values: dict[str, Any] = field(default_factory=dict)
    settings: list[Setting] = field(default_factory=list)
    world_size: int | None = None
    gpus_per_node: int | None = None
    data_parallel: str | None = None
    data_parallel_key: str = ""

    def exact(self, key: str, value: Any, knob: str, knob_value: Any) -> None:
        self._set(key, value, knob, knob_value, EXACT, "")

    def approximate(self, key: str, value: Any, knob: str, knob_value: Any, note: str) -> None:
        self._set(key, value, knob, knob_value, APPROXIMATE, note)

    def ignored(self, key: str, value: Any, note: str) -> None:
        self.settings.append(Setting(self.source, key, value, None, None, IGNORED, note))

    def refuse(self, key: str, value: Any, allowed: str) -> InputError:
        """The error for a setting trainwise cannot honour, even approximately."""
        return InputError("--from-training-args", f"{self.source}: {key}={value!r} {allowed}")

    def spread(self, how: str, key: str) -> None:
        """The file runs data parallel over its GPUs: `how` is "replicate" or "shard"."""
        self.data_parallel, self.data_parallel_key = how, key

    def _set(self, key: str, value: Any, knob: str, knob_value: Any, how: str, note: str) -> None:
        self.values[knob] = knob_value
        self.settings.append(Setting(self.source, key, value, knob, knob_value, how, note))


def truthy(value: Any) -> bool:
    """A foreign boolean: JSON true, or the strings accelerate/DeepSpeed write ("true", "auto"
    counts as on only where the caller says so)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value)


def positive_int(reading: Reading, key: str, value: Any) -> int:
    """`value` as an int >= 1, or the error naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise reading.refuse(key, value, "must be a whole number >= 1")
    try:
        number = int(value)
    except ValueError:
        raise reading.refuse(key, value, "must be a whole number >= 1") from None
    if number < 1 or number != float(value):
        raise reading.refuse(key, value, "must be a whole number >= 1")
    return number
