"""Every rank must run the same plan: a rank started with other flags (a stale plan file
on one node, an edited command line) would otherwise fail in a collective much later, or
silently train something else. Checked once at start, on every rank."""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from trainwise.common.errors import InputError


def check_same_settings(settings: dict, distributed) -> None:
    """Raise InputError on every rank when any rank's `settings` differ from rank 0's,
    naming the first rank and the keys that differ."""
    if not distributed.has_mesh:
        return
    gathered: list = [None] * distributed.world
    dist.all_gather_object(gathered, settings)
    reference = gathered[0]
    for rank, other in enumerate(gathered):
        differing = sorted(k for k in set(reference) | set(other) if reference.get(k) != other.get(k))
        if differing:
            shown = ", ".join(f"{k}={other.get(k)!r} (rank 0: {reference.get(k)!r})" for k in differing[:4])
            raise InputError("--plan", f"rank {rank} was started with other settings than rank 0: {shown}; "
                                       "start every rank with the same plan")


def settings_of(plan, run) -> dict:
    """The values that must match across ranks: every knob and run setting."""
    return {**{f"plan.{k}": v for k, v in plan.to_dict().items()},
            **{f"run.{k}": v for k, v in dataclasses.asdict(run).items()}}
