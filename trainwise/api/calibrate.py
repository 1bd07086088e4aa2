"""`trainwise.api.calibrate`: measure the present device and write its DeviceProfile.

What is measured (trainwise/calibration/), each fitted to a Rate
(`fixed_s + size / per_s`): matmul throughput per dtype the device runs, attention
(SDPA forward and backward, at head dims 16 to 128), element-wise memory bandwidth,
transcendental element-wise ops, drawing random numbers (dropout's mask), these three in
fp32 and in each other element-wise dtype the device runs (bf16; fp16 on a GPU), the eager
per-op host cost, the AdamW step, the host time per kernel and per region call under
torch.compile (not under `quick`: it compiles; on the CPU read off the reference model's
compiled training steps, calibration/compiled_steps.py), a compiled dropout's random numbers (one
compilation, under `quick` too), on a GPU the fp8 matmul (compute
capability 8.9+), copies between pinned host memory and the device both ways, and the
device memory held outside the caching allocator (the CUDA context), and under `nproc` > 1
the four collectives between local processes; on the CPU, last, the reference training
steps timed again, whose change since the fit says whether the machine's speed moved
during the calibration (calibration/steadiness.py). About 30-60 s on a small CPU, a minute
more the first time on a CPU, compiling the reference model (`quick`: a few
seconds, coarse).

The profile goes to `out`, else to the per-user cache (`default_profile_path`), where
`trainwise estimate` and `plan` find it for this device."""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainwise.common.errors import InputError
from trainwise.hardware.device import Device
from trainwise.hardware.host import cpu_model
from trainwise.hardware.profile import DeviceProfile, Rate, default_profile_path, write_profile
from trainwise.hardware.resolve import resolve_device

# Above this run-to-run spread of the repeats a measurement is called noisy.
NOISY_SPREAD = 0.10


@dataclass(frozen=True)
class Calibration:
    profile: DeviceProfile
    path: Path  # where the profile was written
    seconds: float  # wall time of the measurement
    warnings: tuple[str, ...]  # why the profile may be off (a busy machine, noisy repeats)


def check_calibrate_request(device: str, out: str | Path | None, nproc: int) -> tuple[Device, Path]:
    """The present Device `device` names and the file to write, or InputError before any
    measurement: a device that is not on this machine, --out naming a directory or a place
    this process cannot write, --nproc below 1 or above the GPUs present."""
    text = str(device).strip().lower()
    if text != "cpu" and not (text == "cuda" or text.startswith("cuda:")):
        raise InputError("--device", f"{device!r}: calibrate measures a device on this machine: "
                                     "cpu, cuda or cuda:K (a catalog GPU uses its vendor figures without calibration)")
    target = resolve_device(text)
    if target.kind == "cuda" and target.source != "detected":
        raise InputError("--device", f"{device}: this machine has no CUDA GPU to measure; use --device cpu")
    if nproc < 1:
        raise InputError("--nproc", f"{nproc}: the number of local processes must be 1 or more")
    if target.kind == "cuda":
        import torch

        if nproc > torch.cuda.device_count():
            raise InputError("--nproc", f"{nproc} processes need {nproc} GPUs; this machine has "
                                        f"{torch.cuda.device_count()}")
    path = Path(out) if out is not None else default_profile_path(target)
    _check_writable(path, "--out" if out is not None else f"the profile cache {path}")
    return target, path


def _check_writable(path: Path, flag: str) -> None:
    if path.is_dir():
        raise InputError(flag, f"{path} is a directory; name the profile file to write (e.g. {path / 'cpu.json'})")
    existing = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if existing == path.absolute():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(flag, f"{path} cannot be created: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(flag, f"{path} cannot be written: {existing} is read-only to this process")


def calibrate(device: str = "cpu", out: str | Path | None = None, nproc: int = 1,
              quick: bool = False) -> Calibration:
    """Measure `device` (cpu, cuda, cuda:K), write its profile to `out` or the cache."""
    import torch

    from trainwise.calibration.timing import FULL, QUICK

    target, path = check_calibrate_request(device, out, nproc)
    torch_device = torch.device("cpu" if target.kind == "cpu" else f"cuda:{target.index or 0}")
    if torch_device.type == "cuda":
        torch.cuda.set_device(torch_device)
    else:
        from trainwise.hardware.allocator import keep_freed_memory

        keep_freed_memory()  # as `train` runs a CPU step (recorded by _provenance)
    started, load_start = time.perf_counter(), _load()
    settings = QUICK if quick else FULL
    reference = None
    if torch_device.type == "cpu":
        from trainwise.calibration.host_time import reference_steps

        reference = reference_steps(torch_device, settings)  # timed between the rates, to meet their speed
    rates, spreads, measured = _measure_one_device(torch_device, settings,
                                                   between=reference.time_block if reference else None)
    if nproc > 1:
        from trainwise.calibration.collectives import measure_collectives

        found = measure_collectives(nproc, torch_device.type, quick)
        rates["collectives"] = {name: Rate.from_json(rate) for name, rate in found["rates"].items()}
        spreads.update({f"collective {name}": s for name, s in found["spread"].items()})
        measured["collectives"] = {"backend": found["backend"], "sizes": found["convention"]}
        measured["points"].update({f"collective {name}": p for name, p in found["points"].items()})
    profile = DeviceProfile(device_name=_device_name(target), kind=target.kind, source=str(path),
                            matmul=rates["matmul"], attention=rates["attention"], memory=rates["memory"],
                            host_s_per_op=rates["host_s_per_op"], collectives=rates.get("collectives", {}),
                            host_to_device=rates.get("host_to_device"), measured=measured,
                            transcendental=rates["transcendental"], random=rates["random"],
                            optimizer=rates["optimizer"], attention_by_head_dim=rates["attention_by_head_dim"],
                            device_to_host=rates.get("device_to_host"), byte_rates_by_dtype=rates["byte_rates_by_dtype"])
    if target.kind == "cpu":
        profile = _with_training_host(profile, torch_device, settings, spreads, reference)
    # The context before the compiled chains: an eager step loads no Triton kernels.
    profile = _with_context(profile, torch_device)
    profile = _with_compiled_host(profile, torch_device, settings)
    profile = _with_compiled_random(profile, torch_device, settings, spreads)
    _time_steadiness(profile, torch_device, settings)  # last: it times again what was fitted first
    seconds = round(time.perf_counter() - started, 1)
    measured.update(_provenance(target, nproc, quick, settings, seconds, load_start, spreads))
    write_profile(profile, path)
    return Calibration(profile, path, seconds, tuple(busy_warnings(measured)))


def _measure_one_device(device, settings, between=None) -> tuple[dict, dict, dict]:
    """(rates for the profile's fields, spread per measurement, extra measured facts: the
    (size, median seconds) points each rate was fitted to, the optimizer step); `between()`,
    where given, is called before the first measurement and after each group of them."""
    between = between or (lambda: None)
    between()
    from trainwise.calibration import compute
    from trainwise.calibration import memory

    rates: dict = {"matmul": {}, "attention": {}, "attention_by_head_dim": {}, "byte_rates_by_dtype": {}}
    spreads: dict[str, float] = {}
    points: dict[str, list] = {}

    def keep(name: str, found):
        spreads[name], points[name] = found.spread, [[x, t] for x, t in found.points]
        return found.rate

    for dtype in compute.dtypes_to_measure(device):
        rates["matmul"][dtype] = keep(f"matmul {dtype}", compute.measure_matmul(device, dtype, settings))
        # Attention in fp32 with TF32 allowed: the tf32 matmul rate stands in; --float8
        # leaves attention in bf16.
        if dtype not in ("tf32", "fp8"):
            fits = compute.measure_attention(device, dtype, settings)
            reference = compute.reference_head_dim(device, settings)
            rates["attention"][dtype] = keep(f"attention {dtype}", fits[reference])
            rates["attention_by_head_dim"][dtype] = {
                head_dim: rates["attention"][dtype] if head_dim == reference
                else keep(f"attention {dtype} head dim {head_dim}", found) for head_dim, found in fits.items()}
        between()
    for kind in memory.BYTE_OPS:
        rates[kind] = keep(kind, memory.measure_bytes(kind, device, settings))
        between()
    # The element-wise dtypes other than fp32 the device runs: a CPU core takes about as long
    # per element in bf16 as in fp32, so their byte rates differ. Not tf32 (a matmul mode)
    # nor fp8 (--float8's casts, on a GPU, whose element-wise kernels are bound by bytes).
    # Each is fp32's rate over the measured per-byte slowdown of like ops at like sizes.
    relative: dict[str, dict] = {}
    for dtype in (d for d in compute.dtypes_to_measure(device) if d in memory.DTYPES and d != "fp32"):
        for kind in memory.BYTE_OPS:
            ratio, found = memory.measure_bytes_relative(kind, dtype, device, settings)
            spreads[f"{kind} {dtype} vs fp32"], relative[f"{kind} {dtype}"] = found["spread"], found
            rates["byte_rates_by_dtype"].setdefault(kind, {})[dtype] = Rate(rates[kind].per_s / ratio,
                                                                             rates[kind].fixed_s)
        between()
    rates["host_s_per_op"], spreads["host per op"] = memory.measure_host_overhead(device, settings)
    optimizer = memory.measure_optimizer(device, settings)
    rates["optimizer"] = keep("optimizer step", optimizer)
    between()
    if device.type == "cuda":
        for direction in memory.COPY_DIRECTIONS:
            rates[direction] = keep(direction.replace("_", " "), memory.measure_copy(device, direction, settings))
    measured = {"points": points, "byte_rates_vs_fp32": relative, "optimizer_step": {
        "what": "torch.optim.AdamW(foreach=True) on fp32 parameters; per_s in bytes/s read + written by its ops as "
                "the trace counts them (the profile's optimizer rate)",
        **optimizer.rate.to_json(),
        "vs_memory_rate": round(optimizer.rate.per_s / rates["memory"].per_s, 3)}}
    return rates, spreads, measured


def _with_training_host(profile: DeviceProfile, device, settings, spreads: dict, reference=None) -> DeviceProfile:
    """The CPU's host time per op and arithmetic factor as a training step pays them
    (trainwise/calibration/host_time.py), from the reference steps `reference` timed
    between the rate measurements; the bare dispatch of a tiny op stays in
    `measured.host_dispatch_s_per_op`."""
    from trainwise.calibration.host_time import measure_training_host

    fitted, found = measure_training_host(device, profile, settings, reference)
    checkpointed = (found["recomputed"], found["selective_recomputed"])
    spreads["training step"] = max([point["spread"] for point in (*found["steps"], *checkpointed)]
                                   + [point["plain_spread"] for point in checkpointed])
    profile.measured["host_dispatch_s_per_op"] = profile.host_s_per_op
    profile.measured["training_step"] = found
    return fitted


def _with_compiled_host(profile: DeviceProfile, device, settings) -> DeviceProfile:
    """The host seconds per compiled kernel and region call: a compiled chain's
    (calibration/compiled_host.py), then on the CPU the reference model's compiled training
    steps' in place of them where fitted (calibration/compiled_steps.py); what was found, or
    why not, in `measured.compiled_host` and `measured.compiled_steps`."""
    if settings.quick:
        why = "not measured under --quick (it compiles for seconds): the built-in figures stand"
        profile.measured["compiled_host"] = {"why": why}
        if device.type == "cpu":
            profile.measured["compiled_steps"] = {"why": why}
        return profile
    from trainwise.calibration.compiled_host import measure_compiled_host
    from trainwise.calibration.compiled_steps import measure_compiled_steps

    found = measure_compiled_host(device, profile, settings)
    profile.measured["compiled_host"] = found
    profile = dataclasses.replace(profile, host_s_per_compiled_kernel=found["kernel_s"],
                                  host_s_per_compiled_region=found["region_s"])
    if device.type != "cpu":
        return profile
    found = measure_compiled_steps(device, profile, settings)
    profile.measured["compiled_steps"] = found
    return dataclasses.replace(profile, **{field: found[key] for field, key in (
        ("host_s_per_compiled_kernel", "kernel_s"), ("host_s_per_compiled_region", "region_s"))
        if found[key] is not None})


def _with_compiled_random(profile: DeviceProfile, device, settings, spreads: dict) -> DeviceProfile:
    """The rate of random numbers drawn in a compiled region (calibration/compiled_random.py),
    where torch.compile works here; what was timed, or why not, in `measured.compiled_random`.
    Under `quick` too (one compilation, a few seconds): the eager rate it replaces can be far
    off a compiled kernel's, which runs on every thread. Its spread joins `spreads`: a
    compiled kernel's threads wait on each other, so a busy machine stretches it most."""
    from trainwise.calibration.compiled_random import measure_compiled_random

    found = measure_compiled_random(device, settings)
    rate = found.pop("rate")
    if rate is not None:
        spreads["random in a compiled region"] = found["spread"]
    profile.measured["compiled_random"] = {**found, **({"rate": rate.to_json()} if rate else {})}
    return dataclasses.replace(profile, compiled_random=rate)


def _time_steadiness(profile: DeviceProfile, device, settings) -> None:
    """On the CPU, the reference training steps timed again (calibration/steadiness.py) into
    `measured.steadiness`: how far the machine's speed moved since they were fitted."""
    steps = profile.measured.get("training_step", {}).get("steps")
    if not steps:
        return
    from trainwise.calibration.steadiness import retimed

    profile.measured["steadiness"] = retimed(device, steps, settings)


def _with_context(profile: DeviceProfile, device) -> DeviceProfile:
    """On a GPU, the device memory held outside the caching allocator, read after the
    matmuls, attention and optimizer steps loaded their kernels (calibration/context.py)."""
    from trainwise.calibration.context import measure_context

    found = measure_context(device)
    if found is None:
        return profile
    profile.measured["context"] = found
    return dataclasses.replace(profile, context_bytes=found["bytes"])


def _device_name(target: Device) -> str:
    if target.kind == "cuda":
        return target.name
    return f"cpu ({cpu_model()}, {os.cpu_count()} cores)"


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _provenance(target: Device, nproc: int, quick: bool, settings, seconds: float, load_start,
                spreads: dict[str, float]) -> dict:
    import torch

    from trainwise.hardware.profile_settings import present_settings

    # The settings a CPU profile holds predictions to (threads, clock, CPU model): estimate
    # refuses it under others (trainwise/hardware/profile_settings.py).
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "device": target.name, "cpu_count": os.cpu_count(),
            **present_settings(), "nproc": nproc, "quick": quick,
            "repeats_per_size": settings.repeats, "seconds": seconds,
            "load_average_1min": {"start": load_start, "end": _load()},
            "spread": {name: round(value, 4) for name, value in spreads.items()}}


def busy_warnings(measured: dict) -> list[str]:
    """Why a profile may be off: a 1-minute load average above the CPU count, repeats
    that spread more than NOISY_SPREAD (the measurements named), or reference steps that
    ran at another speed at the end of the calibration than when it was fitted."""
    from trainwise.calibration.steadiness import unsteady_warning

    warnings = []
    cores = measured.get("cpu_count") or 1
    loads = [v for v in measured.get("load_average_1min", {}).values() if v is not None]
    if loads and max(loads) > cores:
        warnings.append(f"the machine was busy (1-minute load average up to {max(loads)} on {cores} CPUs): "
                        "the profile may be off; calibrate again on a quiet machine")
    noisy = {name: s for name, s in measured.get("spread", {}).items() if s > NOISY_SPREAD}
    if noisy:
        shown = ", ".join(f"{name} {100 * s:.0f} %" for name, s in sorted(noisy.items(), key=lambda i: -i[1]))
        warnings.append(f"repeats spread more than {100 * NOISY_SPREAD:.0f} % ({shown}): the profile may be off")
    unsteady = unsteady_warning(measured)
    if unsteady:
        warnings.append(unsteady)
    return warnings
