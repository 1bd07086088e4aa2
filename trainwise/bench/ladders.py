"""Ladders: named lists of plans, each a rung that changes a few knobs from a base.

`default` is the classic single-GPU ladder (vanilla, accumulation, checkpointing, fp16,
optimizers, combinations, compile, Liger kernels, float8, LoRA, packed documents, fused loss);
`quick` is a CPU-sized subset that still shows rows this device must skip. Users pass their
own as YAML: a list of {name, plan}."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan

COMBINED = {"batch_size": 1, "grad_accum": 4, "grad_ckpt": True}

DEFAULT = (
    ("vanilla", {"batch_size": 4}),
    ("grad accumulation", {"batch_size": 1, "grad_accum": 4}),
    ("+ grad checkpointing", COMBINED),
    ("selective ckpt", {"batch_size": 4, "grad_ckpt": True, "grad_ckpt_policy": "selective"}),
    ("ckpt every 2", {"batch_size": 4, "grad_ckpt": True, "grad_ckpt_every": 2}),
    ("fp16", {"batch_size": 4, "precision": "fp16"}),
    ("accum + ckpt + fp16", {**COMBINED, "precision": "fp16"}),
    ("adafactor", {"batch_size": 4, "optim": "adafactor"}),
    ("adafactor combined", {**COMBINED, "precision": "fp16", "optim": "adafactor"}),
    ("8-bit adam", {"batch_size": 4, "optim": "adamw-8bit"}),
    ("8-bit adam combined", {**COMBINED, "precision": "fp16", "optim": "adamw-8bit"}),
    ("bf16 combined", {**COMBINED, "precision": "bf16"}),
    ("+ torch.compile", {**COMBINED, "precision": "bf16", "compile": True}),  # per block
    ("+ torch.compile whole model", {**COMBINED, "precision": "bf16", "compile": True, "compile_scope": "model"}),
    ("activation offload", {"batch_size": 4, "precision": "bf16", "activation_offload": True}),
    ("+ liger kernels", {**COMBINED, "precision": "bf16", "kernels": "liger"}),
    ("+ float8 compiled", {**COMBINED, "precision": "bf16", "compile": True, "float8": True}),
    ("lora r16", {"batch_size": 4, "lora_rank": 16}),
    # synthetic rows cut into random documents: the cost of the document mask (causal LMs only)
    ("packed documents", {"batch_size": 4, "packing": "documents"}),
    ("fused loss", {"batch_size": 4, "loss": "fused"}),
)

# Each runnable rung costs two fresh processes (trainwise and the Trainer), ~10 s each on
# a small CPU mostly in imports: six runnable rungs keep the ladder near 3 minutes on
# 2 cores. fp16 and 8-bit Adam stay in to show how a CPU skips them.
QUICK = (
    ("vanilla", {"batch_size": 4}),
    ("grad accumulation", {"batch_size": 1, "grad_accum": 4}),
    ("+ grad checkpointing", COMBINED),
    ("selective ckpt", {"batch_size": 4, "grad_ckpt": True, "grad_ckpt_policy": "selective"}),
    ("fp16", {"batch_size": 4, "precision": "fp16"}),
    ("adafactor", {"batch_size": 4, "optim": "adafactor"}),
    ("8-bit adam", {"batch_size": 4, "optim": "adamw-8bit"}),
    ("lora r8", {"batch_size": 4, "lora_rank": 8}),
    ("fused loss", {"batch_size": 4, "loss": "fused"}),
)

LADDERS = {"default": DEFAULT, "quick": QUICK}


@dataclass(frozen=True)
class Rung:
    name: str
    plan: Plan


def load_ladder(name_or_file: str, base: dict) -> list[Rung]:
    """The rungs of a named ladder or a YAML file, each knob set on top of `base`."""
    if name_or_file in LADDERS:
        entries = [{"name": n, "plan": knobs} for n, knobs in LADDERS[name_or_file]]
        source = f"ladder {name_or_file}"
    else:
        entries, source = _read_file(name_or_file), f"--ladder {name_or_file}"
    Plan.from_dict(base)  # a bad base knob is the flag's fault, not the ladder entry's
    rungs, seen = [], set()
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or \
                not isinstance(entry.get("plan", {}), dict):
            raise InputError("--ladder", f"{source} entry {index + 1} must be a mapping with a name and a plan mapping")
        unknown = sorted(set(entry) - {"name", "plan"})
        if unknown:
            raise InputError("--ladder", f"{source} entry {entry['name']!r}: unknown key(s) {', '.join(unknown)}; "
                                         "an entry is {name: ..., plan: {knob: value, ...}}")
        if entry["name"] in seen:
            raise InputError("--ladder", f"{source}: the name {entry['name']!r} appears twice")
        seen.add(entry["name"])
        try:
            plan = Plan.from_dict({**base, **(entry.get("plan") or {})})
        except InputError as err:
            raise InputError("--ladder", f"{source} entry {entry['name']!r}: {err}") from None
        rungs.append(Rung(entry["name"], plan))
    if not rungs:
        raise InputError("--ladder", f"{source} has no entries")
    return rungs


def _read_file(path: str) -> list:
    file = Path(path)
    if not file.is_file():
        raise InputError("--ladder", f"{path} is neither a ladder name ({', '.join(LADDERS)}) nor a file")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise InputError("--ladder", f"{path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, list):
        raise InputError("--ladder", f"{path} must hold a list of {{name, plan}} entries")
    return data
