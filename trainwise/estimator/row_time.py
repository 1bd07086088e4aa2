"""What one row of the op table costs in a training step: the device seconds of its ops at
the profile's rate for their kind and dtype (`device_seconds`), times how much slower a
training step runs that kind of work than the kernels timed alone (`step_factor`, measured
by calibrate on the CPU); bf16 element-wise rows pay that slowdown per byte at fp32's rate
(`stepped_seconds`). Host time is the step's business (trainwise/estimator/step_time.py),
which adds these rows up."""

from __future__ import annotations

from trainwise.hardware.profile import DeviceProfile, Rate
from trainwise.plan.plan import Plan
from trainwise.trace.op_table import OpCosts

# Tensor contractions: slowed in a training step by the profile's step_contraction_factor,
# every other op class by its step_non_matmul_factor (the optimizer: see step_factor).
CONTRACTIONS = ("matmul", "attention")
OPTIMIZER_PHASES = ("optimizer", "zero_grad")


def priced_rows(costs: OpCosts, plan: Plan, profile: DeviceProfile):
    """(key, values, compiled?, category, seconds) of every row of the op table, each row's
    device seconds as a training step runs them (`stepped_seconds`), for one micro-step;
    host time apart. What `step_breakdown` adds up, row by row (benchmarks/time_breakdown.py
    sets them beside a profiler's)."""
    for key, values, compiled in all_rows(costs):
        category, seconds = stepped_seconds(key, values, plan, profile, compiled)
        yield key, values, compiled, category, seconds


def all_rows(costs: OpCosts):
    """(key, values, compiled?) of every row: the eager ops', then the compiled regions'."""
    for key, values in costs.rows.items():
        yield key, values, False
    for key, values in costs.compiled.items():
        yield key, values, True


def stepped_seconds(key: tuple, values: list[int], plan: Plan, profile: DeviceProfile,
                     compiled: bool = False) -> tuple[str, float]:
    """(category, seconds) of one row of the op table as a training step runs it: its
    device seconds (`device_seconds`) times the step's slowdown (`step_factor`); the
    data's rows as they are (the batch is ready before the step's ops are queued).

    An element-wise row in a dtype with a byte rate of its own (bf16 on a CPU) is slowed
    by the part of the factor beyond the step's compute factor at fp32's rate, per byte,
    not at its own. That part is the step's cold operands and fresh buffers (calibrate
    fits it on an fp32 step, step_non_matmul_factor), and it costs by the byte whatever the
    dtype; the dtype's own rate is measured on cache-hot tensors, where a CPU core spends
    about as long converting a bf16 element as an fp32 one, so it is 1.5-2.6 x slower per
    byte than fp32 there. Multiplying the two priced bf16 element-wise work on the
    project's 2-core EPYC far above what its profiler read in a training step (tiny-gpt2,
    2 x 256, bf16, eager attention: 4.2 ms predicted that way, 2.7 ms this way, 2.3-2.6 ms
    measured in two runs of benchmarks/time_breakdown.py)."""
    category, seconds = device_seconds(key, values, plan, profile, compiled)
    phase, _micro, op_class, dtype = key[:4]
    if phase == "data":
        return category, seconds
    factor = step_factor(phase, op_class, profile, compiled)
    kind = byte_kind(key, values, profile)
    own = profile.step_compute_factor
    if (kind in ("memory", "transcendental") and dtype in profile.byte_rates_by_dtype.get(kind, {})
            and factor != own):
        fp32 = seconds_at(profile.byte_rate(kind, "fp32"), values[0], values[2] + values[3])
        return category, own * seconds + (factor - own) * fp32
    return category, seconds * factor


def step_factor(phase: str, op_class: str, profile: DeviceProfile, compiled: bool = False) -> float:
    """How much slower a training step runs an op of `op_class` than the profile's rate
    (`compiled`: a compiled region's row)."""
    if op_class in CONTRACTIONS:
        return profile.step_compute_factor * profile.step_contraction_factor
    if phase in OPTIMIZER_PHASES and profile.optimizer is not None:
        return profile.step_compute_factor  # its rate was measured on a real optimizer step
    # A row priced at a measured random rate: the eager one, or in a compiled region the
    # compiled one (which falls back to the eager one).
    if op_class == "random" and (profile.random is not None or (compiled and profile.compiled_random is not None)):
        # The generator's arithmetic, not cold operands or fresh buffers, sets its pace (40x
        # an add's per element): the element-wise factor, fitted on a step without dropout,
        # is not its slowdown. The same holds inside a compiled kernel (its own rate, below).
        return profile.step_compute_factor
    if compiled and phase not in OPTIMIZER_PHASES:
        # A fused kernel of a compiled region runs at about the profile's own (hot) rates:
        # the slowdown calibrate fits on an eager step, each op allocating a fresh output
        # and reading operands the op before it left in memory, is not its pace. Read with
        # benchmarks/time_breakdown.py --compile on the project's 2-core EPYC (tiny-llama,
        # small-llama, small-qwen2 at 4 x 64): the fused kernels' self time was 4.1-5.2 x
        # below their price with the factor (4.4), within 20 % of it without.
        return profile.step_compute_factor
    return profile.step_compute_factor * profile.step_non_matmul_factor


def device_seconds(key: tuple, values: list[int], plan: Plan, profile: DeviceProfile,
                    compiled: bool = False) -> tuple[str, float]:
    """(category, device seconds) of one row of the op table (`compiled`: a compiled
    region's row)."""
    phase, _micro, op_class, dtype, recomputed, head_dim = key
    ops, flops, read, written = values
    if phase == "data":
        # The synthetic batch is made on the host and copied over PCIe; on the CPU it is
        # already where the step runs.
        link = profile.host_to_device
        return "data", seconds_at(link, ops, written) if profile.kind == "cuda" and link else 0.0
    kind = byte_kind(key, values, profile)
    if kind == "random" and compiled:
        # Inductor draws a compiled region's random numbers in the fused kernel with a
        # generator of its own, on every thread: not eager bernoulli_'s pace (one thread).
        seconds = seconds_at(profile.compiled_random_rate(dtype), ops, read + written)
    elif kind is not None:  # the row's own dtype's rate: bf16 moves fewer bytes a second on a CPU core
        seconds = seconds_at(profile.byte_rate(kind, dtype), ops, read + written)
    elif op_class in CONTRACTIONS and flops > 0:
        compute = compute_dtype(dtype, plan)
        rate = profile.matmul_rate(compute) if op_class == "matmul" else profile.attention_rate(compute, head_dim)
        seconds = seconds_at(rate, ops, flops)
    elif phase in OPTIMIZER_PHASES and profile.optimizer is not None:
        seconds = seconds_at(profile.optimizer, ops, read + written)
    else:  # metadata, region calls: host time only
        seconds = 0.0
    if phase in OPTIMIZER_PHASES:
        return "optimizer", seconds
    if recomputed:
        return "recompute", seconds
    # metadata: host time only; transcendental ops are element-wise work at their own rate.
    return ("elementwise" if op_class in ("metadata", "region", "transcendental", "random") else op_class), seconds


def byte_kind(key: tuple, values: list[int], profile: DeviceProfile) -> str | None:
    """The profile's rate on bytes (BYTE_KINDS) that prices a row of the op table; None
    where another does (the data's link, the contractions' FLOP rates, the optimizer's own)
    or none (metadata, region calls)."""
    phase, _micro, op_class = key[:3]
    if (phase == "data" or op_class in ("metadata", "region") or (op_class in CONTRACTIONS and values[1] > 0)
            or (phase in OPTIMIZER_PHASES and profile.optimizer is not None)):
        return None
    return op_class if op_class in ("transcendental", "random") else "memory"


def seconds_at(rate: Rate, ops: int, amount: int) -> float:
    """`ops` ops of `amount` in all at `rate` (each pays the fixed cost once)."""
    return ops * rate.fixed_s + amount / rate.per_s if amount > 0 else 0.0


def compute_dtype(dtype: str, plan: Plan) -> str:
    """The rate a matmul on `dtype` tensors runs at: fp32 under --precision tf32 is tf32."""
    if dtype == "fp32":
        return "tf32" if plan.precision == "tf32" else "fp32"
    return dtype if dtype in ("bf16", "fp16", "fp8") else "fp32"
