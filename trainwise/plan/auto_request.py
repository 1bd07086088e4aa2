"""What a `--plan auto` or `--batch-size auto` request leaves to trainwise, read from the
flags before the Plan is built (`cli/train_auto.py`) and decided by `api/auto_choice.py`.
Here, beside the Plan, so reading it imports nothing heavy: a bad flag is answered before
torch is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainwise.plan.plan import Plan


@dataclass
class AutoRequest:
    """What the user left to trainwise: the whole plan, or the micro-batch."""

    plan: bool
    batch: bool
    global_batch: int | None
    margin: float
    fixed: frozenset[str]
    smaller: Plan | None = None  # the one step down, for --batch-size auto
    verify: int = 0  # --verify K: run the top K plans here before choosing
    # run_verify(model, ranked plans, device): runs them here (--verify; the command line
    # renders the table) and returns the outcome (.confident, .recommended)
    run_verify: Callable | None = None
    installed_only: bool | None = None  # --installed-only / --no-installed-only (None: the default, on)
    nnodes: int = 1  # --nnodes: the search lays the plan out over nnodes x --nproc GPUs
    rows: int | None = None  # training sequences the data holds at least (None: unknown)
