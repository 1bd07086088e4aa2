"""The layouts of several GPUs for `trainwise plan --gpus N`: the layout screen
(search/layout_screen.py) run over the knobs the user did not fix, with checkpointing
off and on; the search (search/screen_and_confirm.py) then filters by capacity and confirms the best
with the exact per-rank estimate."""

from __future__ import annotations

from pathlib import Path

from trainwise.common.errors import InputError
from trainwise.common.progress import Progress, silent
from trainwise.hardware import Device
from trainwise.hardware.profile import DeviceProfile, profile_for
from trainwise.models import ModelSpec
from trainwise.plan.plan import Plan
from trainwise.search.candidate import Candidate
from trainwise.search.layout_enumeration import LayoutSpace
from trainwise.search.layout_screen import screen_layouts
from trainwise.search.space import Space

LAYOUT_SCREENING = "screening layouts (checkpointing off, then on)"
# The flags a layout plan is made of: any the user gave is held in every layout screened.
LAYOUT_FIXABLE = ("batch_size", "grad_accum", "nproc", "dp", "fsdp", "zero", "cpu_offload", "tp", "pp",
                  "sequence_parallel", "microbatches", "pp_schedule")


def device_profile(device: Device, profile: str | Path | DeviceProfile | None) -> DeviceProfile | None:
    if isinstance(profile, DeviceProfile):
        return profile
    return profile_for(device, profile)


def check_layout_request(gpus: int, gpus_per_node: int | None, global_batch: int | None, base: Plan,
                         fixed: frozenset[str]) -> None:
    """What a layout search needs, refused before any trace."""
    if gpus == 1:
        return
    if "nproc" in fixed and base.nproc != gpus:
        raise InputError("--nproc", f"must equal --gpus {gpus} in a search over {gpus} GPUs (got {base.nproc})")
    if global_batch is None:
        raise InputError("--global-batch", f"is needed with --gpus {gpus}: the samples per optimizer step over "
                                           "all GPUs, which every layout must reach (e.g. --global-batch "
                                           f"{8 * gpus})")
    if gpus_per_node is not None and (gpus_per_node > gpus or gpus % gpus_per_node):
        raise InputError("--gpus-per-node", f"must divide --gpus {gpus} (got {gpus_per_node})")


def layout_space(base: Plan, fixed: frozenset[str], gpus: int, gpus_per_node: int | None,
                 global_batch: int) -> LayoutSpace:
    """The screen's space: every layout of `gpus`, holding the layout flags given."""
    held = tuple((k, getattr(base, k)) for k in LAYOUT_FIXABLE if k in fixed)
    micro = (base.batch_size,) if "batch_size" in fixed else LayoutSpace.micro_batches
    return LayoutSpace(gpus=gpus, gpus_per_node=gpus_per_node or gpus, global_batch=global_batch,
                       micro_batches=micro, fixed=held)


def layout_candidates(spec: ModelSpec, space: Space, device: Device, profile, gpus: int, gpus_per_node: int | None,
                      inter_node_gbps: float | None, global_batch: int,
                      progress: Progress = silent) -> tuple[list[Candidate], list[str]]:
    """(every screened layout plan, notes): the space's preferred precision, optimizer,
    attention kernel and LoRA choice (its first of each), checkpointing as searched (off
    and on: checkpointing can free the memory that lets a layout without offload or with
    a larger micro-batch fit, so it is screened even when a layout fits without it)."""
    rates = device_profile(device, profile)
    first = {name: values[0] for name, values in space.choices.items()}
    layouts = layout_space(space.base, space.fixed, gpus, gpus_per_node, global_batch)
    candidates, notes = [], []
    for done, grad_ckpt in enumerate(space.choices["grad_ckpt"]):
        progress(done, len(space.choices["grad_ckpt"]), LAYOUT_SCREENING)
        base = space.base.replace(**{**first, "grad_ckpt": grad_ckpt})
        candidates += screen_layouts(spec, base, device, rates, layouts, inter_node_gbps)
    progress(len(space.choices["grad_ckpt"]), len(space.choices["grad_ckpt"]), LAYOUT_SCREENING)
    if not candidates:
        raise InputError("--global-batch", f"no layout of {gpus} GPUs reaches a global batch of {global_batch} with "
                                           f"the flags held fixed; try a multiple of {gpus}, e.g. "
                                           f"--global-batch {gpus * max(1, round(global_batch / gpus))}")
    searched = [k for k in ("precision", "optim", "attention", "lora_rank") if len(space.choices[k]) > 1]
    notes += [f"layouts screened with {', '.join(f'{k} {first[k]}' for k in searched)} (the first choice of each;"
             " the others are not screened across layouts)"] if searched else []
    return candidates, notes
