"""The search space: which value of each knob the search may try, and which the user fixed.

A knob the user gave (a flag or a plan-file key) is held fixed: the space has that one value.
Techniques that change the training math are tried only when the user allows them
(`--allow`). Liger's kernels, compile and float8 are not knobs of the screen: they are
composed around its confirmed plans (trainwise/search/refine.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from trainwise.common.errors import InputError
from trainwise.hardware import Device
from trainwise.hardware.installation import BITSANDBYTES, installed
from trainwise.plan.plan import Plan

# What `--allow` may name: the techniques that change the training math.
ALLOWABLE = ("lora", "adamw-8bit", "adafactor", "bf16-pure", "fp16", "float8")
LORA_RANK = 16
# Without --global-batch, micro-batches are powers of two up to this (the fit filter cuts them).
LARGEST_MICRO_BATCH = 1024
# Why a technique was left out under --installed-only.
NOT_HERE = "{need}; --no-installed-only searches it anyway"
# The knobs whose values change the traced step (memory and time are re-measured per value);
# the micro-batch and accumulation are composed arithmetically from two traced sizes.
TRACE_KNOBS = ("precision", "optim", "grad_ckpt", "attention", "lora_rank")


@dataclass(frozen=True)
class Space:
    """Every value the search tries, per knob. `base` carries the fixed and untouched knobs;
    `batches` is (micro-batch, accumulation) pairs; `data_parallel` the data-parallel degree
    they were computed for; `notes` say what was not searched and why."""

    base: Plan
    fixed: frozenset[str]
    allow: frozenset[str]
    global_batch: int | None
    data_parallel: int
    batches: tuple[tuple[int, int], ...]
    choices: dict[str, tuple]
    notes: tuple[str, ...] = ()
    # Only techniques whose packages are installed here (planning for this machine).
    installed_only: bool = False

    def variants(self) -> list[dict]:
        """Every combination of the trace knobs' values, as Plan changes."""
        names = list(TRACE_KNOBS)
        return [dict(zip(names, values)) for values in itertools.product(*(self.choices[n] for n in names))]


def parse_allow(text: str | None) -> frozenset[str]:
    """The techniques named by `--allow a,b`; InputError listing the allowed ones."""
    if not text:
        return frozenset()
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in ALLOWABLE]
    if unknown:
        raise InputError("--allow", f"{', '.join(unknown)} is not a technique the search can allow; "
                                    f"allowed: {', '.join(ALLOWABLE)}")
    return frozenset(names)


def math_changes(plan: Plan, device: Device) -> tuple[str, ...]:
    """The techniques of `plan` that change the training math (for marking in tables and JSON)."""
    changes = []
    if plan.lora:
        changes.append("lora")
    if plan.optim in ("adamw-8bit", "adafactor"):
        changes.append(plan.optim)
    if plan.precision == "bf16-pure":
        changes.append("bf16-pure")
    if plan.precision == "fp16" and _has_bf16(device):
        changes.append("fp16")
    if plan.float8:
        changes.append("float8")
    return tuple(changes)


def build_space(base: Plan, fixed: frozenset[str], device: Device, allow: frozenset[str],
                global_batch: int | None, data_parallel: int = 1, flash_refusal: str | None = "not checked",
                attention_refusals: dict[str, str] | None = None, installed_only: bool = False,
                rows: int | None = None) -> Space:
    """The space for `base` on `device`. `flash_refusal`/`attention_refusals`: why a kernel
    cannot run (from the model's attention rules), so it is left out with a note."""
    notes = []
    optimizers = _optimizers(device, allow)
    if installed_only and "adamw-8bit" in optimizers and not installed(BITSANDBYTES.module):
        optimizers = tuple(o for o in optimizers if o != "adamw-8bit")
        notes.append(f"adamw-8bit not searched: {NOT_HERE.format(need=BITSANDBYTES.need)}")
    choices = {
        "precision": _pick(base, fixed, "precision", _precisions(device, allow)),
        "optim": _pick(base, fixed, "optim", optimizers),
        "grad_ckpt": _pick(base, fixed, "grad_ckpt", (False, True)),
        "lora_rank": _pick(base, fixed, "lora_rank", (0, LORA_RANK) if "lora" in allow else (0,)),
    }
    kernels = ["sdpa", "eager"] + (["flash"] if flash_refusal is None else [])
    for kernel, reason in (attention_refusals or {}).items():
        if kernel in kernels and "attention" not in fixed:
            kernels.remove(kernel)
            notes.append(f"{kernel} attention not searched: {reason}")
    if flash_refusal is not None and "attention" not in fixed:
        notes.append(f"flash attention not searched: {flash_refusal}")
    choices["attention"] = _pick(base, fixed, "attention", tuple(kernels))
    batches = batch_options(base, fixed, global_batch, data_parallel)
    if rows is not None:  # each replica's micro-batch takes rows of its own
        kept = tuple(b for b in batches if b[0] * data_parallel <= rows)
        if not kept:
            raise InputError("--data", f"holds about {rows} sequence(s): too few for a micro-batch of "
                                       f"{min(b[0] for b in batches)} on each of {data_parallel} replica(s); "
                                       "lower --seq-len, --batch-size or add data")
        batches = kept
    return Space(base=base, fixed=fixed, allow=allow, global_batch=global_batch, data_parallel=data_parallel,
                 batches=batches, choices=choices, notes=tuple(notes), installed_only=installed_only)


def batch_options(base: Plan, fixed: frozenset[str], global_batch: int | None,
                  data_parallel: int) -> tuple[tuple[int, int], ...]:
    """(micro-batch, accumulation) pairs; with a global batch, micro-batch x accumulation x
    data-parallel degree equals it exactly. InputError naming the binding flag when none does."""
    if global_batch is None:
        accum = base.grad_accum
        if "batch_size" in fixed:
            return ((base.batch_size, accum),)
        return tuple((2 ** k, accum) for k in range(LARGEST_MICRO_BATCH.bit_length()))
    if global_batch % data_parallel:
        raise InputError("--global-batch", f"{global_batch} is not divisible by the data-parallel degree "
                                           f"{data_parallel}; closest: {_closest_multiples(global_batch, data_parallel)}")
    per_replica = global_batch // data_parallel
    pairs = [(mb, per_replica // mb) for mb in range(1, per_replica + 1) if per_replica % mb == 0]
    for position, knob, flag in ((0, "batch_size", "--batch-size"), (1, "grad_accum", "--grad-accum")):
        if knob not in fixed:
            continue
        value = getattr(base, knob)
        pairs = [p for p in pairs if p[position] == value]
        if not pairs:
            raise InputError(flag, f"{value} x {data_parallel} data-parallel replicas does not divide --global-batch "
                                   f"{global_batch}; closest: {_closest_multiples(global_batch, value * data_parallel)}")
    return tuple(pairs)


def _closest_multiples(value: int, step: int) -> str:
    lower = (value // step) * step
    options = [v for v in (lower, lower + step) if v > 0]
    return " or ".join(f"--global-batch {v}" for v in options)


def _pick(base: Plan, fixed: frozenset[str], name: str, searched: tuple) -> tuple:
    return (getattr(base, name),) if name in fixed else searched


def _has_bf16(device: Device) -> bool:
    return device.kind == "cpu" or (device.gpu is not None and device.gpu.supports_bf16)


def _precisions(device: Device, allow: frozenset[str]) -> tuple[str, ...]:
    """Mixed bf16 where the device has it (else fp16, the usual choice there), plus full
    precision. fp32 is tried only where tf32 is missing: tf32 holds the same memory and is
    never slower. fp16 where bf16 exists, and pure bf16, only when allowed."""
    if device.kind == "cpu":
        return ("bf16", "fp32") + (("bf16-pure",) if "bf16-pure" in allow else ())
    gpu = device.gpu
    if gpu is not None and gpu.supports_bf16:
        extra = tuple(p for p in ("fp16", "bf16-pure") if p in allow)
        return ("bf16", "tf32" if gpu.supports_tf32 else "fp32") + extra
    return ("fp16", "fp32")


def _optimizers(device: Device, allow: frozenset[str]) -> tuple[str, ...]:
    extra = ["adafactor"] if "adafactor" in allow else []
    if "adamw-8bit" in allow and device.kind == "cuda":
        extra.append("adamw-8bit")
    return ("adamw-fused", "adamw", *extra)
