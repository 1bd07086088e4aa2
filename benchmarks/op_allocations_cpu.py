"""Which op allocated what in a real CPU step, beside the trace: for finding where an
estimate and a measured step part.

The real step is the accuracy tests' reference (tests/memory_reference.py); each aten op it
runs is wrapped in a profiler range, so every allocation event of the CPU allocator is
credited to the innermost op running. Printed: the measured and predicted peaks, the op
running at the measured peak with what it allocated beyond its outputs (no fake kernel
shows that: kernel scratch), the ops that allocate most beyond their outputs over the step,
and the ops whose output bytes differ between the real step and the trace (views and
in-place ops left out: they allocate nothing). oneDNN's instruction set can be capped to see what its kernels add:

    python benchmarks/op_allocations_cpu.py tiny-vit --task image-cls --seq-len 64 --precision bf16-pure
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/op_allocations_cpu.py tiny-vit ...   # no oneDNN bf16 kernels
"""

from __future__ import annotations

import argparse
import bisect
import collections
import sys

import provenance

provenance.add_repo_to_path()
sys.path.insert(0, str(provenance.REPO / "tests"))

import torch  # noqa: E402
from torch.profiler import record_function  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

PREFIX = "op#"


class OpRanges(TorchDispatchMode):
    """Runs each aten op inside a profiler range named after its call number, and notes
    its name, inputs and output bytes under that number."""

    def __init__(self):
        super().__init__()
        self.calls: dict[int, tuple[str, list, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        number = len(self.calls)
        with record_function(f"{PREFIX}{number}"):
            out = func(*args, **(kwargs or {}))
        inputs = [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)]
        output_bytes = sum(t.untyped_storage().nbytes() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        self.calls[number] = (func.__name__, inputs, output_bytes)
        return out


def allocations_by_call(events) -> tuple[dict[int, list[tuple[int, int]]], list[tuple[int, int, int]]]:
    """(call number -> its (time, delta) allocation events, the calls' (start, end, number))."""
    ranges = sorted((e.start_ns(), e.end_ns(), int(e.name()[len(PREFIX):])) for e in events
                    if e.name().startswith(PREFIX))
    starts = [r[0] for r in ranges]
    credited = collections.defaultdict(list)
    for e in events:
        if e.name() != "[memory]":
            continue
        at = e.start_ns()
        i = bisect.bisect_right(starts, at) - 1
        while i >= 0 and not ranges[i][0] <= at <= ranges[i][1]:
            i -= 1  # ranges nest: the latest-starting one that holds the event is the innermost
        if i >= 0:
            credited[ranges[i][2]].append((at, e.nbytes()))
    return credited, ranges


def traced_output_bytes(spec, plan) -> collections.Counter:
    from trainwise.models import build_model, example_batch
    from trainwise.trace.step_trace import trace_training_step

    model = build_model(spec, "meta", attention=plan.attention, batch_size=plan.batch_size, seq_len=plan.seq_len)
    trace = trace_training_step(model, lambda: example_batch(spec, plan.batch_size, plan.seq_len, "cpu"), plan,
                                "cpu", task=spec.task)
    totals = collections.Counter()
    for record in trace.records:
        if record.phase != "setup":
            totals[record.op] += record.nbytes
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--task")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    from memory_reference import measure_step
    from trainwise.api import estimate
    from trainwise.models import resolve_model
    from trainwise.plan.plan import Plan

    spec = resolve_model(args.model, task=args.task)
    plan = Plan.from_dict({"device": "cpu", "batch_size": args.batch_size, "seq_len": args.seq_len,
                           "precision": args.precision})
    predicted = estimate(spec, plan).memory.peak_allocated
    events, ops = [], OpRanges()
    with ops:
        measured = measure_step(spec, plan, events_out=events)
    print(f"{args.model} {args.precision}: measured {measured.peak_allocated:,} B, predicted {predicted:,} B "
          f"({predicted - measured.peak_allocated:+,} B, {predicted / measured.peak_allocated - 1:+.2%}), "
          f"peak in {measured.peak_phase}; oneDNN bf16 kernels: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    credited, ranges = allocations_by_call(events)
    _print_peak_op(events, credited, ranges, ops)
    _print_scratch(credited, ops, args.top)
    _print_output_differences(ops, _calls_in_step(events, ranges), traced_output_bytes(spec, plan))


def _print_peak_op(events, credited, ranges, ops) -> None:
    from memory_reference import peak_in_step

    _, _, peak_at = peak_in_step(events)
    holding = [r for r in ranges if r[0] <= peak_at <= r[1]]
    if not holding:
        print("  at the peak: no op running")
        return
    number = holding[-1][2]  # the innermost: ranges are sorted by start
    name, inputs, output_bytes = ops.calls[number]
    allocated = sum(d for _, d in credited[number] if d > 0)
    print(f"  at the peak: {name} {inputs[:4]}: allocated {allocated:,} B, of which {allocated - output_bytes:,} B "
          f"beyond its outputs ({output_bytes:,} B)")


def _print_scratch(credited, ops, top: int) -> None:
    beyond, calls = collections.Counter(), collections.Counter()
    for number, deltas in credited.items():
        name, inputs, output_bytes = ops.calls[number]
        extra = sum(d for _, d in deltas if d > 0) - output_bytes
        if extra > 0:
            key = (name, str(inputs[:4]))
            beyond[key] += extra
            calls[key] += 1
    print("  allocated beyond their outputs (bytes, calls, op, first inputs):")
    for (name, inputs), extra in beyond.most_common(top):
        print(f"    {extra:>11,} {calls[(name, inputs)]:>4}  {name} {inputs}")


def _calls_in_step(events, ranges) -> set[int]:
    """Numbers of the calls made inside the measured step (not building the model or the
    optimizer state, which the trace does before its window too)."""
    from memory_reference import STEP_RANGE

    step = next(e for e in events if e.name() == STEP_RANGE)
    return {number for start, _, number in ranges if step.start_ns() <= start <= step.end_ns()}


def _print_output_differences(ops, in_step: set[int], traced: collections.Counter) -> None:
    real = collections.Counter()
    for number in in_step:
        name, _, output_bytes = ops.calls[number]
        real[name] += output_bytes
    views = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "select", "slice", "detach", "alias",
             "unsqueeze", "squeeze", "as_strided", "split", "unbind", "narrow", "diagonal", "unfold", "chunk"}
    # in-place ops (a trailing underscore) return their target, allocated before
    differing = [op for op in sorted(set(real) | set(traced)) if real[op] != traced[op]
                 and op.split(".")[0] not in views and not op.split(".")[0].endswith("_")]
    print("  output bytes that differ, real vs trace:" if differing else "  every op's output bytes: as traced")
    for op in differing:
        print(f"    {op:40s} real {real[op]:>12,}  trace {traced[op]:>12,}")


if __name__ == "__main__":
    main()
