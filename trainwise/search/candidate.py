"""Candidate: one plan the search considered, with what was predicted for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.common.rates import JobRates
from trainwise.plan.layout import resolve_layout
from trainwise.plan.plan import Plan


@dataclass(frozen=True)
class Candidate(JobRates):
    """A plan and its prediction on the target machine.

    memory_bytes: predicted device total of the fullest rank (what nvidia-smi would show).
    step_s: predicted seconds per optimizer step; tokens_per_s and samples_per_s the whole
    job's (all data-parallel replicas), tokens_per_s_per_gpu and samples_per_s_per_gpu the
    job's over its GPUs (`gpus`: the plan's layout's world size, 1 without one).
    exact: True when both figures come from a full estimate of this very plan,
    False when composed from cached traces of neighbouring plans (the search's screen).
    changes_math: the allowed techniques this plan uses that change the training math
    (LoRA, 8-bit or Adafactor optimizers, bf16-pure, fp16 where bf16 exists)."""

    plan: Plan
    memory_bytes: int
    step_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float | None
    breakdown: dict[str, float] = field(default_factory=dict)
    exact: bool = False
    changes_math: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return resolve_layout(self.plan).world if self.plan.is_distributed else 1

