"""Every layout of N GPUs the screen considers, as Plans: dp x tp x pp = N (tp dividing the
heads and at most one node; pp at most the blocks), a data-parallel kind (DDP, ZeRO-1,
ZeRO-2, ZeRO-3, ZeRO-3 with CPU offload), sequence parallel where the family has it, the
pipeline schedule and chunk count, and the micro-batch with the accumulation that reaches
the global batch. Combinations the engine refuses are left out by its own checks
(plan/layout.py, plan/partition.py). Hybrid sharding (dp and fsdp both above 1) is not
enumerated."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainwise.common.errors import InputError
from trainwise.models.families import family_of
from trainwise.plan.layout import resolve_layout
from trainwise.plan.partition import check_layout_combination, check_pipeline, check_tensor_parallel_sizes
from trainwise.plan.plan import Plan
from trainwise.trace.depth import block_count

DATA_PARALLEL_KINDS = ("ddp", "zero1", "zero2", "zero3", "offload")
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


@dataclass(frozen=True)
class LayoutSpace:
    """What the screen enumerates. global_batch: samples per optimizer step over all ranks."""

    gpus: int
    gpus_per_node: int
    global_batch: int
    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    kinds: tuple[str, ...] = DATA_PARALLEL_KINDS
    schedules: tuple[str, ...] = PIPELINE_SCHEDULES
    chunk_factors: tuple[int, ...] = (1, 2, 4)  # pipeline chunks per micro-batch, in multiples of pp
    sequence_parallel: tuple[bool, ...] = (False, True)
    # (knob, value) pairs every plan must keep (the flags a user gave): layouts that
    # differ are not enumerated; a fixed --microbatches replaces chunk_factors.
    fixed: tuple[tuple[str, object], ...] = ()

    def held(self, plan: Plan) -> bool:
        return all(getattr(plan, knob) == value for knob, value in self.fixed)

    def fixed_value(self, knob: str, default=None):
        return dict(self.fixed).get(knob, default)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_parallel_degrees(config, space: LayoutSpace) -> list[int]:
    degrees = []
    for tp in _divisors(space.gpus):
        if tp > space.gpus_per_node:
            break
        try:
            check_tensor_parallel_sizes(config, tp)
        except InputError:
            continue
        degrees.append(tp)
    return degrees


def _degrees(kind: str, replicas: int, tp: int, pp: int) -> dict | None:
    """The plan's data-parallel knobs for `kind` over `replicas` ranks, None where the
    kind does not apply (one replica: only "ddp", meaning none; ZeRO-1 only alone)."""
    if replicas == 1:
        return {"dp": 1, "fsdp": 1, "zero": None, "cpu_offload": False} if kind == "ddp" else None
    if kind == "ddp":
        return {"dp": replicas, "fsdp": 1, "zero": None, "cpu_offload": False}
    if kind == "zero1" and (tp > 1 or pp > 1):
        return None
    stage = {"zero1": 1, "zero2": 2, "zero3": 3, "offload": 3}[kind]
    return {"dp": 1, "fsdp": replicas, "zero": stage, "cpu_offload": kind == "offload"}


def layout_plans(config, plan: Plan, space: LayoutSpace) -> Iterator[Plan]:
    """Every valid layout plan of `space` with `plan`'s other knobs."""
    blocks = block_count(config) or 1
    family = family_of(config)
    pipelines = family is not None and family.pipeline is not None
    sequence_family = family is not None and family.sequence_parallel is not None
    for tp in tensor_parallel_degrees(config, space):
        if space.fixed_value("tp", tp) != tp:
            continue
        for pp in _divisors(space.gpus // tp):
            if pp > blocks or (pp > 1 and not pipelines) or space.fixed_value("pp", pp) != pp:
                continue
            replicas = space.gpus // (tp * pp)
            if space.global_batch % replicas:
                continue
            rows = space.global_batch // replicas
            sequence = [sp for sp in space.sequence_parallel if not sp or (tp > 1 and sequence_family
                                                                          and plan.seq_len % tp == 0)]
            for kind in space.kinds:
                degrees = _degrees(kind, replicas, tp, pp)
                if degrees is None:
                    continue
                for sp in sequence:
                    base = dict(degrees, nproc=space.gpus, tp=tp, pp=pp, sequence_parallel=sp)
                    yield from _batches(config, plan, space, base, rows)


def _batches(config, plan: Plan, space: LayoutSpace, base: dict, rows: int) -> Iterator[Plan]:
    """The micro-batches dividing the rank's rows per step, with the pipeline's options."""
    pp = base["pp"]
    for batch in space.micro_batches:
        if rows % batch:
            continue
        knobs = dict(base, batch_size=batch, grad_accum=rows // batch)
        chunks = [space.fixed_value("microbatches")] if space.fixed_value("microbatches") else \
            [f * pp for f in space.chunk_factors]
        options = [{}] if pp == 1 else [{"pp_schedule": s, "microbatches": c} for s in space.schedules for c in chunks]
        for option in options:
            candidate = plan.replace(**knobs, **option)
            if not space.held(candidate):
                continue
            try:
                if pp > 1:
                    check_pipeline(config, pp, candidate.pp_schedule, candidate.microbatches, batch)
                check_layout_combination(candidate, resolve_layout(candidate))
            except InputError:
                continue
            yield candidate
