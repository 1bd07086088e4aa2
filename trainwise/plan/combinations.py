"""Refusals that need nothing but the Plan: its layout, and knobs that cannot go together.

`estimate`, `train` and `bench` all call `check_combinations` before any model is built,
so one combination is refused by every command with the same line (a `plan` command can
call it on a Plan alone)."""

from __future__ import annotations

from trainwise.common.errors import InputError, NotSupportedYet
from trainwise.plan.layout import Layout, resolve_layout
from trainwise.plan.partition import check_layout_combination


def check_combinations(plan, world_size: int | None = None) -> Layout:
    """The plan's Layout on `world_size` processes (default: the plan's own, as
    `resolve_layout` reads it); InputError naming the flag when its knobs contradict each
    other (`--sequence-parallel` without `--tp`, `--classic` with a multi-process layout, ...)."""
    layout = resolve_layout(plan, world_size)
    check_layout_combination(plan, layout)
    if plan.classic != "none" and plan.is_distributed:
        raise InputError("--classic", "is a one-process layout; drop --nproc/--dp/--fsdp/--zero/--tp/--pp")
    check_checkpointing_knobs(plan, layout)
    if not plan.compile and (plan.compile_scope != "blocks" or plan.compile_mode != "default"):
        flag = "--compile-scope" if plan.compile_scope != "blocks" else "--compile-mode"
        raise InputError(flag, "says how to compile, but nothing is compiled without --compile: add --compile")
    return layout


def check_checkpointing_knobs(plan, layout: Layout) -> None:
    """--grad-ckpt-policy and --grad-ckpt-every shape checkpointing; without --grad-ckpt
    there is none to shape, and asking for it is refused rather than ignored. Every K-th
    block counts blocks over the whole stack, a pipeline stage's estimate from its own
    first block: the two agree only where each stage starts on a multiple of K, which is
    not checked yet, so K > 1 with --pp is refused."""
    if plan.grad_ckpt:
        if plan.grad_ckpt_every > 1 and layout.pp > 1:
            raise NotSupportedYet("--grad-ckpt-every", f"--pp {layout.pp} (use --grad-ckpt-every 1)")
        return
    if plan.grad_ckpt_policy != "full":
        raise InputError("--grad-ckpt-policy", f"{plan.grad_ckpt_policy} applies to checkpointing: add --grad-ckpt")
    if plan.grad_ckpt_every != 1:
        raise InputError("--grad-ckpt-every", f"{plan.grad_ckpt_every} applies to checkpointing: add --grad-ckpt")
