"""`--from-training-args FILE`: the Plan knobs another tool's configuration stands for.

A file is recognised by what it holds: a Transformers TrainingArguments JSON (as
`to_json_string()` writes it), a DeepSpeed config, or an accelerate config (YAML or JSON).
Several files may be given (TrainingArguments with the accelerate config it is launched
with); they must agree where they overlap. Flags the user types win over every file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainwise.common.errors import InputError
from trainwise.plan.foreign_reading import Reading, Setting
from trainwise.plan.from_accelerate import read_accelerate
from trainwise.plan.from_deepspeed import read_deepspeed
from trainwise.plan.from_training_args import deepspeed_reading, read_training_args

FLAG = "--from-training-args"
LAYOUT_FLAGS = ("nproc", "dp", "fsdp", "tp", "pp")


@dataclass(frozen=True)
class ForeignConfig:
    """The knobs the files give (`values`, before the typed flags), every setting read and
    how (`settings`), the launch's GPUs per node when a file says, and `notes` on what the
    files do not say (the sequence length, the number of GPUs)."""

    files: tuple[str, ...]
    values: dict[str, Any]
    settings: tuple[Setting, ...]
    gpus_per_node: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return {"files": list(self.files), "knobs": self.values,
                "settings": [s.to_json() for s in self.settings], "notes": list(self.notes)}


def read_foreign_configs(paths: list[str], typed: dict[str, Any]) -> ForeignConfig:
    """Read `paths` into knobs; `typed` are the flags the user gave (they win, and may supply
    what the files leave open, such as --nproc). InputError naming the file and setting for
    anything that cannot be honoured."""
    readings: list[Reading] = []
    for path in paths:
        readings.extend(_read_one(Path(path)))
    values = _merged(readings)
    notes = []
    _layout(readings, values, typed, notes)
    if "seq_len" not in typed:
        notes.append("sequence length: not in these files (the Trainer takes it from the data): "
                     f"{typed.get('seq_len', 512)} tokens assumed; give --seq-len N")
    per_node = {r.gpus_per_node for r in readings if r.gpus_per_node}
    return ForeignConfig(files=tuple(paths), values=values, settings=tuple(s for r in readings for s in r.settings),
                         gpus_per_node=min(per_node) if per_node else None, notes=tuple(notes))


def load_config_file(path: str | Path) -> dict:
    """A JSON or YAML mapping from `path` (InputError naming the file otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(FLAG, f"file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as err:
        raise InputError(FLAG, f"{path} is not valid JSON or YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(FLAG, f"{path} must hold a mapping of settings")
    return data


def _read_one(path: Path) -> list[Reading]:
    data = load_config_file(path)
    source = str(path)
    relative = lambda name: load_config_file(Path(name) if Path(name).is_absolute() else path.parent / name)  # noqa: E731
    if "per_device_train_batch_size" in data or "output_dir" in data:
        readings = [read_training_args(data, source)]
        inner = deepspeed_reading(data, source, relative)
        return readings + ([inner] if inner else [])
    if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data or "train_batch_size" in data:
        return [read_deepspeed(data, source)]
    if "distributed_type" in data or "compute_environment" in data:
        result = read_accelerate(data, source, relative)
        return result if isinstance(result, list) else [result]
    raise InputError(FLAG, f"{path} is not a TrainingArguments JSON (per_device_train_batch_size), a DeepSpeed config "
                           "(zero_optimization, train_micro_batch_size_per_gpu) or an accelerate config "
                           "(distributed_type)")


def _merged(readings: list[Reading]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for reading in readings:
        for knob, value in reading.values.items():
            if knob in values and values[knob] != value:
                raise InputError(FLAG, f"{knob.replace('_', '-')}: {origin[knob]} gives {values[knob]!r} but "
                                       f"{reading.source} gives {value!r}")
            values[knob], origin[knob] = value, reading.source
    return values


def _layout(readings: list[Reading], values: dict, typed: dict, notes: list[str]) -> None:
    """The number of GPUs: from the files (they must agree), else from --nproc; a file that
    shards over GPUs without saying how many needs one of them."""
    sizes = {r.world_size for r in readings if r.world_size}
    if len(sizes) > 1:
        raise InputError(FLAG, "the files disagree on the number of GPUs: " +
                               ", ".join(f"{r.source}: {r.world_size}" for r in readings if r.world_size))
    spread = [r for r in readings if r.data_parallel]
    if sizes and not any(flag in typed for flag in LAYOUT_FLAGS):
        world = sizes.pop()
        if world > 1:
            values["nproc"] = world
        return
    if spread and not sizes and not any(flag in typed for flag in LAYOUT_FLAGS):
        first = spread[0]
        if any(r.data_parallel == "shard" for r in spread):
            sharding = next(r for r in spread if r.data_parallel == "shard")
            raise InputError("--nproc", f"{sharding.source} shards over GPUs ({sharding.data_parallel_key}) but does "
                                        "not say how many: add --nproc N (all GPUs of the run)")
        notes.append(f"{first.source} runs data parallel ({first.data_parallel_key}) without saying over how many GPUs: "
                     "estimated for one GPU (DDP adds little per GPU); give --nproc N for the per-GPU figures")

