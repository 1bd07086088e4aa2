"""The trace cache: what a one-device estimate read from its traced step, kept on disk, so
the same request in a later process skips building the model and tracing it (seconds of
transformers' import and of the fake-tensor step).

A file holds the estimate's figures before its time is priced: the checked plan, the
memory, the parameter counts, the activations by module, the depths traced, the notes,
and the step's work (the op table at full depth, the offload traffic;
estimator/step_work.py). The time is priced afresh from that work with the device profile
of the day, so a calibration made later counts.

The key holds everything that feeds the trace: the catalog record (the model's config as
shipped, canonical JSON), the task asked for, the whole plan, the device (its catalog
figures and any measured context), the depths traced, the versions of Python, torch,
transformers, trainwise and the optional packages a technique traces, and a hash of every
source and data file of the trainwise package. Only catalog models are cached (by
name, or by a Hub id the catalog lists): a directory, another Hub id or a model function
brings configs or code the key would have to read (and a directory's config needs
transformers to resolve), so those are traced every time. One JSON file per key in
traces/ of the per-user cache (common/cache_dir.py), written atomically; a file that
cannot be read or does not parse is ignored with a note."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path

from trainwise.common.atomic import atomic_write_text
from trainwise.common.cache_dir import user_cache_dir
from trainwise.estimator.activation_offload_time import OffloadTraffic
from trainwise.estimator.memory import MemoryEstimate
from trainwise.estimator.result import EstimateResult
from trainwise.estimator.step_time import price_step
from trainwise.estimator.step_work import StepWork
from trainwise.hardware import Device
from trainwise.hardware.profile import DeviceProfile
from trainwise.models.catalog import CatalogRecord
from trainwise.plan.plan import Plan
from trainwise.trace.depth import TRACED_BLOCKS
from trainwise.trace.op_table import OpCosts

FORMAT = 1
# Packages whose code runs in the trace (a technique's, where installed); absent ones count too.
TRACED_PACKAGES = ("torch", "transformers", "huggingface-hub", "trainwise", "peft", "bitsandbytes", "torchao",
                   "liger-kernel", "flash-attn", "triton")


def trace_cache_dir() -> Path:
    return user_cache_dir() / "traces"


def cache_key(record: CatalogRecord, task: str | None, plan: Plan, device: Device) -> str:
    """The file name of a request's cached estimate: a hash of every input of its trace."""
    parts = {"format": FORMAT, "model": dataclasses.asdict(record), "task": task, "plan": plan.to_dict(),
             "device": dataclasses.asdict(device), "traced_blocks": list(TRACED_BLOCKS), "versions": versions(),
             "source": source_hash()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def versions() -> dict[str, str | None]:
    """Python's version and each traced package's installed version (None: not installed)."""
    found = {"python": platform.python_version()}
    for name in TRACED_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """A hash of every .py and .json file of the trainwise package (names and contents): an
    edit anywhere in trainwise, a checkout of another commit included, misses the cache."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def read_cached(key: str, device: Device, profile: DeviceProfile | None) -> tuple[EstimateResult | None, str | None]:
    """(the cached estimate of `key`, priced with `profile`, or None; a note when a file was
    there but could not be used)."""
    path = trace_cache_dir() / f"{key}.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return None, f"trace cache: {path} is unreadable ({error.strerror or error}); traced afresh"
    try:
        return _result_from(json.loads(data.decode("utf-8")), device, profile), None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return None, f"trace cache: {path} is damaged ({type(error).__name__}); traced afresh"


def write_cached(key: str, result: EstimateResult) -> str | None:
    """Keep `result` under `key`; a note when the cache cannot be written (the estimate stands)."""
    path = trace_cache_dir() / f"{key}.json"
    try:
        atomic_write_text(path, json.dumps(_entry(result)))
    except OSError as error:
        return f"trace cache: cannot write {path} ({error.strerror or error}); the next estimate traces again"
    return None


def _entry(result: EstimateResult) -> dict:
    work = result.work
    return {"format": FORMAT, "model": result.model, "task": result.task, "plan": result.plan.to_dict(),
            "params": result.params, "trainable_params": result.trainable_params,
            "memory": dataclasses.asdict(result.memory), "activations_by_module": result.activations_by_module,
            "traced_blocks": list(result.traced_blocks) if result.traced_blocks else None,
            "total_blocks": result.total_blocks, "notes": list(result.notes), "extrapolation": result.extrapolation,
            "costs": {"rows": _rows(work.costs.rows), "compiled": _rows(work.costs.compiled)},
            "offload": dataclasses.asdict(work.offload) if work.offload else None}


def _rows(table: dict) -> list:
    return [[list(key), values] for key, values in table.items()]


def _result_from(data: dict, device: Device, profile: DeviceProfile | None) -> EstimateResult:
    if data["format"] != FORMAT:
        raise ValueError(f"format {data['format']!r}")
    plan = Plan.from_dict(data["plan"])
    costs = OpCosts({tuple(key): values for key, values in data["costs"]["rows"]},
                    {tuple(key): values for key, values in data["costs"]["compiled"]})
    work = StepWork(costs, OffloadTraffic(**data["offload"]) if data["offload"] else None)
    time = price_step(work, plan, device, profile, data["model"]) if profile is not None else None
    traced = data["traced_blocks"]
    return EstimateResult(model=data["model"], task=data["task"], params=data["params"],
                          trainable_params=data["trainable_params"], device=device, plan=plan,
                          memory=MemoryEstimate(**data["memory"]), activations_by_module=data["activations_by_module"],
                          traced_blocks=tuple(traced) if traced else None, total_blocks=data["total_blocks"],
                          notes=tuple(data["notes"]), extrapolation=data["extrapolation"], time=time, work=work,
                          from_cache=True)
