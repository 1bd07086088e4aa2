"""Where a real CPU step spends its time, next to where the step-time model says it does.

    OMP_NUM_THREADS=1 python benchmarks/time_breakdown.py tiny-llama --profile cpu.json \
        --batch-size 4 --seq-len 64 [--grad-accum 4] [--grad-ckpt [--grad-ckpt-policy selective]]
        [--optim adafactor] [--loss fused] [--precision bf16] [--attention eager] [--top 12]
        [--compile [--compile-scope model]]

A diagnostic, not a results page: it trains the plan in this process for a few steps,
runs torch.profiler over the last ones, and adds the profiler's self CPU time of every
aten op up by the op class trainwise/trace/op_costs.py gives it and the dtype it computes
in (the op counts too), and the wall time the ops do not account for (Python, the training
loop, the data). Next to it: the time model's prediction of the same plan, per category,
and per op class and dtype (each row's device seconds as a step runs them, host time apart). The
profiler's own per-op cost inflates every op a little; the op counts are exact.

With --compile, inductor's generated kernels are recorded too (its cpp.enable_kernel_profile):
they are set beside the compiled regions' fused rows ("compiled kernel"), and the self time of
the compiled machinery around them (the Dynamo cache lookup, the compiled region's entry,
AOTAutograd's autograd function forward and backward, the generated wrapper's Python) beside
the host time the model prices per kernel and per region call ("compiled host")."""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time

import provenance

provenance.add_repo_to_path()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--profile", required=True)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--optim", default="adamw")
    parser.add_argument("--loss", default="default", help="default or fused (the chunked linear cross-entropy)")
    parser.add_argument("--grad-ckpt-policy", default="full", help="full or selective (with --grad-ckpt)")
    parser.add_argument("--precision", default="fp32", help="fp32 or bf16")
    parser.add_argument("--attention", default="sdpa", help="sdpa or eager")
    parser.add_argument("--top", type=int, default=0, help="also list the N aten ops with the most self time")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (inductor's kernels profiled)")
    parser.add_argument("--compile-scope", default="blocks", help="blocks or model (with --compile)")
    return parser.parse_args(argv)


@functools.lru_cache(maxsize=None)  # once per op name, not once per profiled event
def op_class(name: str) -> str:
    import torch

    from trainwise.trace.op_costs import classify

    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None) if name.startswith("aten::") else None
    if packet is None:
        return "not aten"
    overload = getattr(packet, "default", None) or getattr(packet, packet.overloads()[0])
    return classify(overload)


# The profiler's names of an op's input dtypes, as trainwise/trace/op_costs.py names them.
PROFILER_DTYPES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64"}
PROFILER_OTHER_DTYPES = {"long int": "int64", "int": "int32", "bool": "bool"}
# The profiler's events of the compiled machinery around inductor's kernels (their self
# time: what the model prices as host time per kernel and per region call).
COMPILED_HOST_EVENTS = ("Torch-Compiled Region", "TorchDynamo Cache Lookup", "CompiledFunction",
                        "## Call CompiledFxGraph", "AOTDispatcher Runtime Wrapper", "Pregraph bytecode")
COMPILED_KERNEL, COMPILED_HOST = ("compiled kernel", "fused"), ("compiled host", "-")


def event_dtype(event) -> str:
    """The dtype an op computes in, as the op table keys it: its first floating-point input's
    (the profiler records input dtypes with record_shapes), else its first input's."""
    names = [name for name in (getattr(event, "input_dtypes", None) or []) if name]
    floating = [name for name in names if name in PROFILER_DTYPES]
    first = (floating or names or ["none"])[0]
    return PROFILER_DTYPES.get(first) or PROFILER_OTHER_DTYPES.get(first, first)


def measure(model: str, plan, steps: int) -> tuple[dict, dict, float]:
    """({(class, dtype): [self seconds, calls]}, {aten op: [self seconds, calls]}, wall
    seconds per step) over `steps` profiled steps."""
    import torch.profiler

    if plan.compile:
        import torch._inductor.config

        torch._inductor.config.cpp.enable_kernel_profile = True  # each generated kernel an event,
        torch._inductor.config.force_disable_caches = True  # not code cached without the events
    from trainwise.api import train
    from trainwise.engine.run_config import RunConfig

    warmup, state = 3, {"profiler": None, "started": None, "wall": None}

    def on_step(entry):
        if entry.step == warmup:
            state["profiler"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                       record_shapes=True)  # for the input dtypes
            state["profiler"].__enter__()
            state["started"] = time.perf_counter()
        elif entry.step == warmup + steps:
            state["wall"] = (time.perf_counter() - state["started"]) / steps
            state["profiler"].__exit__(None, None, None)

    train(model, plan=plan, run=RunConfig(steps=warmup + steps + 1), on_step=on_step)
    by_class = collections.defaultdict(lambda: [0.0, 0])
    by_op = collections.defaultdict(lambda: [0.0, 0])
    for event in state["profiler"].events():
        seconds = event.self_cpu_time_total / 1e6 / steps
        if event.name.startswith("aten::"):
            rows = (by_class[(op_class(event.name), event_dtype(event))], by_op[event.name])
        elif "cpp_fused" in event.name:  # graph_N_cpp_fused_...: a generated kernel
            rows = (by_class[COMPILED_KERNEL],)
        elif event.name.startswith(COMPILED_HOST_EVENTS):
            rows = (by_class[COMPILED_HOST],)
        else:
            continue
        for row in rows:
            row[0] += seconds
            row[1] += 1 / steps
    return dict(by_class), dict(by_op), state["wall"]


def predicted_rows(result, plan, profile) -> dict:
    """{(class, dtype): [device seconds, ops]} of the estimate's op table as a step runs it
    (trainwise/estimator/row_time.py: priced_rows), the optimizer's rows as one class,
    over all micro-steps; host time apart, but for the compiled regions' (per kernel and per
    region call: COMPILED_HOST); their fused rows are one class (COMPILED_KERNEL)."""
    from trainwise.estimator.row_time import CONTRACTIONS, OPTIMIZER_PHASES, priced_rows
    from trainwise.estimator.step_time import compiled_host_s, micro_step_weights

    rows = collections.defaultdict(lambda: [0.0, 0])
    weights = micro_step_weights(plan.grad_accum, 1)
    for key, values, compiled, _category, seconds in priced_rows(result.work.costs, plan, profile):
        phase, micro, op_class, dtype = key[:4]
        if phase == "data":
            continue
        times = weights[micro] if phase in ("forward", "backward") else 1
        if compiled:
            rows[COMPILED_HOST][0] += values[0] * compiled_host_s(op_class, profile) * times
            rows[COMPILED_HOST][1] += values[0] * times
            if op_class == "region":
                continue  # host time only
        fused = compiled and op_class not in CONTRACTIONS
        row = rows[COMPILED_KERNEL if fused else ("optimizer" if phase in OPTIMIZER_PHASES else op_class, dtype)]
        row[0] += seconds * times
        row[1] += values[0] * times
    return dict(rows)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from trainwise.api import estimate
    from trainwise.hardware.profile import read_profile
    from trainwise.plan.plan import Plan

    plan = Plan(batch_size=args.batch_size, seq_len=args.seq_len, grad_accum=args.grad_accum,
                grad_ckpt=args.grad_ckpt, grad_ckpt_policy=args.grad_ckpt_policy, optim=args.optim, loss=args.loss,
                precision=args.precision, attention=args.attention, device="cpu", compile=args.compile,
                compile_scope=args.compile_scope)
    profile = read_profile(args.profile)
    result = estimate(args.model, plan, profile=profile)
    predicted, rows = result.time, predicted_rows(result, plan, profile)
    measured, by_op, wall = measure(args.model, plan, args.steps)
    print(f"predicted step {predicted.step_s * 1e3:.1f} ms; measured wall {wall * 1e3:.1f} ms per step (profiled)")
    for name, seconds in predicted.breakdown.items():
        if seconds:
            print(f"  predicted {name:16s} {seconds * 1e3:8.2f} ms")
    print("  per op class and dtype: predicted device seconds (host time apart) | measured self time:")
    accounted = 0.0
    for key in sorted(set(rows) | set(measured), key=lambda k: -max(rows.get(k, [0])[0], measured.get(k, [0])[0])):
        (guess, ops), (seconds, calls) = rows.get(key, [0.0, 0]), measured.get(key, [0.0, 0])
        accounted += seconds
        print(f"  {key[0]:15s} {key[1]:10s} predicted {guess * 1e3:8.2f} ms ({ops:6.0f} ops) | "
              f"measured {seconds * 1e3:8.2f} ms ({calls:6.0f} calls, self, incl. nested)")
    print(f"  measured  outside aten ops {(wall - accounted) * 1e3:8.2f} ms")
    for name, (seconds, calls) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  op {name:40s} {seconds * 1e3:8.2f} ms  {calls:5.0f} calls  {op_class(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
