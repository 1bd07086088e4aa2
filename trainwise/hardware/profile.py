"""DeviceProfile: how fast a device runs each kind of work, for the step-time model.

Every rate is a latency-bandwidth pair (`Rate`): an op of size x takes
`fixed_s + x / per_s` seconds. For a matmul x is its FLOPs, for element-wise work the
bytes it reads and writes, for a collective the bytes each rank sends. The fixed term is
what makes small ops slower than the peak suggests, without a table per shape. Matmul and
attention rates are per dtype; so are the element-wise ones (`byte_rate`) where calibrate
measured them: a CPU core takes about as long per element in bf16 as in fp32.

A profile comes from one of two places, and says which in `source`:
* "catalog": a catalog GPU's vendor figures times assumed efficiency factors (what
  well-tuned kernels reach on large shapes: trainwise/hardware/catalog_profile.py;
  documented in docs/plan.md);
* a file written by `trainwise calibrate`, measured on the device itself (the CPU
  included: there is no catalog figure for a CPU, so its time is only predicted after a
  calibration).

`corrections` holds measured/predicted step-time ratios that `plan --verify` wrote back,
keyed by the plan's shape of work (see trainwise/estimator/step_time.py); the time model
multiplies its prediction by the matching one."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from trainwise.common.atomic import atomic_write_text
from trainwise.common.cache_dir import user_cache_dir
from trainwise.common.errors import InputError
from trainwise.hardware.device import Device
from trainwise.hardware.rate import Rate, rate_at_head_dim, stand_in_dtype  # noqa: F401 - read from here too

PROFILE_VERSION = 1
# How a time predicted from a catalog profile names its rates, wherever it is shown.
CATALOG_RATES = "catalog figures x assumed efficiencies"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
# The rates on bytes read + written that `byte_rate` reads per dtype (the fields of those names).
BYTE_KINDS = ("memory", "transcendental", "random")
# measured["kind"] of a cache file holding catalog figures plus the corrections `plan
# --verify` measured (trainwise/search/corrections.py): its rates were not measured.
CORRECTIONS_OVER_CATALOG = "corrections over catalog"

# Host seconds under torch.compile (trainwise/trace/fusion.py), by device kind: one kernel
# launched by inductor's generated wrapper, and one call into a compiled region (guards,
# AOTAutograd's runtime wrapper, its autograd node), forward and backward each. Used where
# a profile has no measurement of its own (catalog profiles, older files, --quick ones):
# `trainwise calibrate` measures the pair (trainwise/calibration/compiled_host.py; on the
# CPU from the reference model's compiled training steps, compiled_steps.py). The CPU
# pair was set from a one-off timing on the project's 2-core CPU (a compiled chain of
# matmul + element-wise blocks at 2 and 12 blocks: about 21.5 us more per block of about
# five kernels, about 140 us more per step over two region calls); the CUDA pair is a guess
# at a Python wrapper's Triton launch.
COMPILED_KERNEL_HOST_S = {"cpu": 4e-6, "cuda": 5e-6}
COMPILED_REGION_HOST_S = {"cpu": 70e-6, "cuda": 40e-6}
GB_S = 1e9


@dataclass(frozen=True)
class DeviceProfile:
    """Measured or catalog rates of one device. Keys of `matmul` and `attention` are the
    dtype names of trainwise/hardware/gpu.py ("fp32", "tf32", "bf16", "fp16", "fp8")."""

    device_name: str
    kind: str  # "cpu" or "cuda"
    source: str  # "catalog" or the profile file's path
    matmul: dict[str, Rate]  # FLOPs
    attention: dict[str, Rate]  # FLOPs of the attention kernels (forward and backward)
    memory: Rate  # bytes read + written by fp32 element-wise, normalisation and optimizer ops
    host_s_per_op: float  # host time to dispatch one eager op
    collectives: dict[str, Rate] = field(default_factory=dict)  # bytes per rank, inside a node
    host_to_device: Rate | None = None  # bytes, pinned host to device (offload); None on the CPU
    corrections: dict[str, float] = field(default_factory=dict)
    measured: dict = field(default_factory=dict)  # when, versions, ranks: provenance of a calibration
    # How much slower a training step's arithmetic runs than the rates above measured one
    # kernel at a time (operands cold in cache, strided tensors); measured by calibrate on
    # the CPU from a reference training step, 1.0 for catalog figures and older files.
    step_compute_factor: float = 1.0
    # Bytes read + written by element-wise ops that evaluate a transcendental function (exp,
    # log, tanh, erf: trainwise/trace/op_costs.py), measured by calibrate: on a CPU core
    # their arithmetic, not memory, sets the pace. None (catalog, older files): the memory rate.
    transcendental: Rate | None = None
    # Bytes read + written by ops that draw random numbers (dropout's mask), measured by
    # calibrate: on a CPU core the generator's arithmetic, ~40x an add's per element, sets
    # the pace. None (catalog, older files): the memory rate.
    random: Rate | None = None
    # How much slower a training step's work other than matmuls (element-wise, norms,
    # attention, the optimizer) runs than the rates above, on top of step_compute_factor.
    # Calibrate fits this one on the CPU and leaves step_compute_factor at 1.0: a step's
    # matmuls run near their rate timed alone, its element-wise ops on fresh, cold buffers
    # do not. 1.0 for catalog figures and older files (whose one factor slowed everything).
    step_non_matmul_factor: float = 1.0
    # How much slower a training step's matmul and attention kernels run than the same ops
    # replayed at once with their operands hot (measured by calibrate on the CPU; 1.0 for
    # catalog figures and older files, whose step_non_matmul_factor covered attention).
    step_contraction_factor: float = 1.0
    # The optimizer phase's kernels (the step, gradient clipping) on the bytes the trace
    # counts for them: a real AdamW step timed by calibrate, on the CPU far slower than the
    # memory rate. None (catalog, older files): the memory rate x step_non_matmul_factor.
    optimizer: Rate | None = None
    # Host seconds per op that activation checkpointing recomputes: the op's dispatch plus
    # the checkpoint's saved-tensor hooks and the block's Python run again, measured by
    # calibrate on the CPU. None: host_s_per_op.
    host_s_per_recomputed_op: float | None = None
    # The same under --grad-ckpt-policy selective, whose policy runs in Python for every op
    # of a checkpointed block, in forward and again in recompute (torch's selective
    # checkpoint dispatch mode): that host time, lumped onto the recomputed ops, measured
    # by calibrate on the CPU. None: host_s_per_recomputed_op.
    host_s_per_selective_recomputed_op: float | None = None
    # Host seconds per kernel a compiled region launches and per call into one (see
    # COMPILED_*_HOST_S); None: the figures above for the device's kind.
    host_s_per_compiled_kernel: float | None = None
    host_s_per_compiled_region: float | None = None
    # Attention rates by dtype, then by head dim, measured by calibrate: a CPU's attention
    # kernel runs a head dim of 16 at about a third of its rate at 64 in bf16 (the softmax
    # over the scores is the same work whatever the head dim; the FLOPs are not). Read
    # between measured head dims by `rate_at_head_dim`. Empty (catalog, older files): the
    # one `attention` rate of the dtype at every head dim.
    attention_by_head_dim: dict[str, dict[int, Rate]] = field(default_factory=dict)
    # Bytes from the device to pinned host memory (activation offload's forward copies,
    # CPU offload's gradients), measured by calibrate on a GPU. None (catalog, older
    # files, the CPU): host_to_device stands in for both directions.
    device_to_host: Rate | None = None
    # Device memory the process holds outside PyTorch's caching allocator (the CUDA
    # context and the kernel images a step loads), measured by calibrate on a GPU after its
    # matmuls, attention and optimizer ran. None: the estimate of hardware/cuda_overheads.py.
    context_bytes: int | None = None
    # The element-wise rates (BYTE_KINDS: memory, transcendental, random) of dtypes other
    # than fp32, kind -> dtype -> Rate, measured by calibrate: a CPU core spends about as
    # long per element on bf16 as on fp32, so it moves fewer bytes a second. Read by
    # `byte_rate`. Empty (catalog, older files): the fp32 fields above for every dtype.
    byte_rates_by_dtype: dict[str, dict[str, Rate]] = field(default_factory=dict)
    # Bytes read + written by the random ops of a compiled region (dropout's mask, as the
    # trace charges them: trainwise/trace/fusion.py), fp32, measured by calibrate on a
    # compiled dropout (trainwise/calibration/compiled_random.py): inductor draws the numbers
    # with a generator of its own, on every thread, where eager CPU `bernoulli_` uses one.
    # None (catalog, older files, a machine where torch.compile fails): the eager `random`
    # rate prices them. Read by `compiled_random_rate`.
    compiled_random: Rate | None = None

    @property
    def compiled_kernel_host_s(self) -> float:
        return self.host_s_per_compiled_kernel if self.host_s_per_compiled_kernel is not None \
            else COMPILED_KERNEL_HOST_S.get(self.kind, COMPILED_KERNEL_HOST_S["cuda"])

    @property
    def compiled_region_host_s(self) -> float:
        return self.host_s_per_compiled_region if self.host_s_per_compiled_region is not None \
            else COMPILED_REGION_HOST_S.get(self.kind, COMPILED_REGION_HOST_S["cuda"])

    @property
    def device_to_host_rate(self) -> Rate | None:
        """Device to host: the measured rate, else the host-to-device one."""
        return self.device_to_host or self.host_to_device

    @property
    def rates_measured(self) -> bool:
        """Whether the rates were measured by calibrate: not a catalog profile, nor a cache
        file holding catalog figures plus verify's corrections."""
        return self.source != "catalog" and self.measured.get("kind") != CORRECTIONS_OVER_CATALOG

    def matmul_rate(self, dtype: str) -> Rate | None:
        """`dtype`'s matmul rate; where the profile has none, fp8's is bf16's (float8
        replaces bf16 matmuls: no speed-up assumed, where fp32's would price them several
        times slower than the bf16 they replace), any other's fp32's."""
        return self.matmul.get(dtype) or self.matmul.get(stand_in_dtype(dtype, self.matmul))

    def attention_rate(self, dtype: str, head_dim: int = 0) -> Rate | None:
        """The attention rate of `dtype` at `head_dim` where calibrate measured head dims
        (0: unknown, the one rate), else the dtype's one rate, else its matmul rate."""
        by_head_dim = self.attention_by_head_dim.get(dtype)
        if head_dim > 0 and by_head_dim:
            return rate_at_head_dim(by_head_dim, head_dim)
        return self.attention.get(dtype) or self.matmul_rate(dtype)

    def byte_rate(self, kind: str, dtype: str) -> Rate:
        """The rate of `kind` (BYTE_KINDS) on bytes of `dtype`: its own where calibrate
        measured one, else the fp32 field's (transcendental and random without one: memory's)."""
        if kind not in BYTE_KINDS:
            raise ValueError(f"kind {kind!r}: one of {BYTE_KINDS}")
        return self.byte_rates_by_dtype.get(kind, {}).get(dtype) or getattr(self, kind) or self.memory

    def compiled_random_rate(self, dtype: str) -> Rate:
        """The rate of a compiled region's random ops on bytes of `dtype`: `compiled_random`
        over the per-byte slowdown calibrate measured for eager random numbers in `dtype`
        (the generator's work is per element, whatever the element's size); without a
        compiled rate, the eager one (`byte_rate`)."""
        eager = self.byte_rate("random", dtype)
        if self.compiled_random is None:
            return eager
        fp32 = self.byte_rate("random", "fp32")
        return Rate(self.compiled_random.per_s * eager.per_s / fp32.per_s, self.compiled_random.fixed_s)

    def to_json(self) -> dict:
        return {"version": PROFILE_VERSION, "device_name": self.device_name, "kind": self.kind,
                "matmul": {k: r.to_json() for k, r in self.matmul.items()},
                "attention": {k: r.to_json() for k, r in self.attention.items()},
                "memory": self.memory.to_json(), "host_s_per_op": self.host_s_per_op,
                "collectives": {k: r.to_json() for k, r in self.collectives.items()},
                "host_to_device": self.host_to_device.to_json() if self.host_to_device else None,
                "corrections": dict(self.corrections), "measured": dict(self.measured),
                "step_compute_factor": self.step_compute_factor,
                "transcendental": self.transcendental.to_json() if self.transcendental else None,
                "random": self.random.to_json() if self.random else None,
                "step_non_matmul_factor": self.step_non_matmul_factor,
                "step_contraction_factor": self.step_contraction_factor,
                "optimizer": self.optimizer.to_json() if self.optimizer else None,
                "host_s_per_recomputed_op": self.host_s_per_recomputed_op,
                "host_s_per_selective_recomputed_op": self.host_s_per_selective_recomputed_op,
                "host_s_per_compiled_kernel": self.host_s_per_compiled_kernel,
                "host_s_per_compiled_region": self.host_s_per_compiled_region,
                "attention_by_head_dim": {dtype: {str(dim): rate.to_json() for dim, rate in rates.items()}
                                          for dtype, rates in self.attention_by_head_dim.items()},
                "device_to_host": self.device_to_host.to_json() if self.device_to_host else None,
                "context_bytes": self.context_bytes,
                "byte_rates_by_dtype": {kind: {dtype: rate.to_json() for dtype, rate in rates.items()}
                                        for kind, rates in self.byte_rates_by_dtype.items()},
                "compiled_random": self.compiled_random.to_json() if self.compiled_random else None}

    @classmethod
    def from_json(cls, data: dict, source: str) -> "DeviceProfile":
        host, transcendental, optimizer = data.get("host_to_device"), data.get("transcendental"), data.get("optimizer")
        recomputed, random = data.get("host_s_per_recomputed_op"), data.get("random")
        kernel, region = data.get("host_s_per_compiled_kernel"), data.get("host_s_per_compiled_region")
        back, context = data.get("device_to_host"), data.get("context_bytes")
        selective, compiled_random = data.get("host_s_per_selective_recomputed_op"), data.get("compiled_random")
        return cls(device_name=str(data["device_name"]), kind=str(data["kind"]), source=source,
                   matmul={k: Rate.from_json(v) for k, v in data["matmul"].items()},
                   attention={k: Rate.from_json(v) for k, v in data.get("attention", {}).items()},
                   memory=Rate.from_json(data["memory"]), host_s_per_op=float(data["host_s_per_op"]),
                   collectives={k: Rate.from_json(v) for k, v in data.get("collectives", {}).items()},
                   host_to_device=Rate.from_json(host) if host else None,
                   corrections={k: float(v) for k, v in data.get("corrections", {}).items()},
                   measured=dict(data.get("measured", {})),
                   step_compute_factor=float(data.get("step_compute_factor", 1.0)),
                   transcendental=Rate.from_json(transcendental) if transcendental else None,
                   random=Rate.from_json(random) if random else None,
                   step_non_matmul_factor=float(data.get("step_non_matmul_factor", 1.0)),
                   step_contraction_factor=float(data.get("step_contraction_factor", 1.0)),
                   optimizer=Rate.from_json(optimizer) if optimizer else None,
                   host_s_per_recomputed_op=float(recomputed) if recomputed is not None else None,
                   host_s_per_selective_recomputed_op=float(selective) if selective is not None else None,
                   host_s_per_compiled_kernel=float(kernel) if kernel is not None else None,
                   host_s_per_compiled_region=float(region) if region is not None else None,
                   attention_by_head_dim={dtype: {int(dim): Rate.from_json(rate) for dim, rate in rates.items()}
                                          for dtype, rates in data.get("attention_by_head_dim", {}).items()},
                   device_to_host=Rate.from_json(back) if back else None,
                   context_bytes=int(context) if context is not None else None,
                   byte_rates_by_dtype={kind: {dtype: Rate.from_json(rate) for dtype, rate in rates.items()}
                                        for kind, rates in data.get("byte_rates_by_dtype", {}).items()},
                   compiled_random=Rate.from_json(compiled_random) if compiled_random else None)


def with_measured_context(device: Device, profile: DeviceProfile | None) -> Device:
    """`device` with the CUDA context `profile` measured on this same GPU model, for the
    memory estimate; unchanged where the profile has none or is another device's."""
    if profile is None or profile.context_bytes is None or not device.is_cuda or profile.device_name != device.name:
        return device
    return dataclasses.replace(device, measured_context_bytes=profile.context_bytes)


def profile_key(device: Device) -> str:
    """The file name a device's calibrated profile is cached under."""
    name = "cpu" if device.kind == "cpu" else device.name
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-") or "device"


def default_profile_dir() -> Path:
    """profiles/ in the per-user trainwise cache (trainwise/common/cache_dir.py)."""
    return user_cache_dir() / "profiles"


def default_profile_path(device: Device) -> Path:
    return default_profile_dir() / f"{profile_key(device)}.json"


def read_profile(path: str | Path, flag: str = "--profile") -> DeviceProfile:
    """A profile file; a missing or malformed one is an InputError naming `flag`."""
    file = Path(path)
    if not file.is_file():
        raise InputError(flag, f"{path} is not a file (write one with trainwise calibrate --out {path})")
    try:
        data = json.loads(file.read_text())
        if data.get("version") != PROFILE_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {PROFILE_VERSION}")
        return DeviceProfile.from_json(data, source=str(file))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise InputError(flag, f"{path} is not a trainwise device profile ({err}); "
                               "write one with trainwise calibrate") from None


def write_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write `profile` atomically as JSON; returns the path."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(file, json.dumps(profile.to_json(), indent=2) + "\n")
    return file


def profile_for(device: Device, path: str | Path | None = None) -> DeviceProfile | None:
    """The profile a prediction for `device` uses: `path` if given; else a calibrated one
    cached for this device name; else the catalog's; else None (no time predicted). A CPU
    profile measured under other settings than this process's (thread count, clock, CPU
    model) is refused (trainwise/hardware/profile_settings.py)."""
    from trainwise.hardware.catalog_profile import catalog_profile  # it builds a DeviceProfile: imports this file
    from trainwise.hardware.profile_settings import check_profile_settings

    if path is not None:
        profile = read_profile(path)
        if profile.kind != device.kind or (device.kind == "cuda" and profile.device_name != device.name):
            raise InputError("--profile", f"{path} was measured on {profile.device_name}, "
                                          f"not on the target device {device.name}")
        check_profile_settings(profile, "--profile")
        return profile
    cached = default_profile_path(device)
    if cached.is_file():
        profile = read_profile(cached, flag=f"the cached profile {cached}")
        check_profile_settings(profile, "the cached profile")
        return profile
    return catalog_profile(device)
