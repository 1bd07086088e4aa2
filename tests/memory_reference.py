"""Measure one real training step on CPU: the reference the tracer's estimates are checked against.

Nothing here uses the tracer (`trainwise.trace`) or the estimator (`trainwise.estimator`):
the step runs on real CPU tensors and every figure is read from PyTorch itself. Only the
step *recipe* is shared (`trainwise.techniques`: precision policy, prepare_model, build_optimizer,
compute_loss), because that is what is being estimated. The step sequence is written out
again below, on purpose, rather than imported from the tracer.

How each figure is measured
---------------------------
weights, buffers      unique storages (deduplicated by data pointer) of the model's
                      parameters and buffers after `prepare_model`.
gradients             unique storages of `.grad` after the last micro-batch's backward.
optimizer             unique tensor storages in `optimizer.state` after the step
                      (moments, Adafactor factors, step counters).
activations           storages autograd saved for backward during one micro-batch's forward,
                      seen through `torch.autograd.graph.saved_tensors_hooks` (the pack hook
                      returns the tensor unchanged, so memory is what it would be without
                      the hook), and the outputs selective checkpointing keeps for
                      backward in its own cache (`observe_kept`). A storage is counted once, from when it is first packed
                      until it dies (a weak reference on the storage object; PyTorch keeps
                      one Python storage object per live storage). Parameter and buffer
                      storages are excluded. The figure is the largest total alive at any
                      pack or at the end of the forward, over the micro-batches measured.
peak_allocated        from the PyTorch profiler's memory events. With
                      `torch.profiler.profile(activities=[CPU], profile_memory=True)` the
                      c10 CPU allocator reports every allocation and free made while
                      profiling (a "[memory]" event whose `nbytes()` is +size or -size; in
                      torch 2.13 read them from `prof.profiler.kineto_results.events()`,
                      sorted by `start_ns()`). A free of a block allocated *before* the
                      profiler started is dropped (the allocator does not know its size and
                      warns), so the profiler is started before the model is even built:
                      then the running sum of the deltas is the live CPU tensor memory of
                      this run at every moment. The measured step is wrapped in a
                      `record_function` range; `peak_allocated` is the largest running sum
                      between that range's start and end, which includes everything alive
                      when the step began (weights, buffers, optimizer state).
                      `live_at_step_start` is the running sum at the range's start (it
                      should equal weights + buffers + optimizer; see `unexplained_at_start`).

This counts allocations of c10's CPU allocator: every tensor, and the scratch tensors
ATen kernels create with `at::empty`. Memory that oneDNN/BLAS libraries obtain from
`malloc` directly is not seen (it is not tensor memory on a GPU either).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import weakref
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from trainwise.models import ModelSpec, build_model, example_batch
from trainwise.plan.plan import Plan
from trainwise.techniques import build_optimizer, compute_loss, precision_policy, prepare_model
from trainwise.techniques.selective_checkpoint import observe_kept

STEP_RANGE = "trainwise.reference.step"


@dataclass
class MeasuredStep:
    """Bytes measured on a real CPU step (see the module docstring for how)."""

    params: int
    trainable_params: int
    weights: int
    buffers: int
    gradients: int
    optimizer: int
    activations: int
    peak_allocated: int
    live_at_step_start: int
    peak_phase: str
    activations_per_micro_step: list[int] = field(default_factory=list)

    @property
    def unexplained_at_start(self) -> int:
        """Live bytes at the step's start not held by weights, buffers or optimizer state."""
        return self.live_at_step_start - self.weights - self.buffers - self.optimizer

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def measure_step(spec: ModelSpec, plan: Plan, *, seed: int = 0, events_out: list | None = None) -> MeasuredStep:
    """Build `spec` on the CPU, apply `plan`'s recipe and measure one steady-state step.

    The step: optimizer state created first with stand-in (zero) gradients, then all
    `grad_accum` micro-batches (forward under CPU autocast when the precision is mixed,
    backward of loss / grad_accum), gradient clipping when max_grad_norm > 0,
    optimizer.step(), zero_grad(set_to_none=True). (The tracer runs at most two
    micro-batches, claiming later ones repeat the second; running them all here checks
    that claim.) `events_out`, when given, receives the profile's kineto events, for a tool
    that attributes the allocations to ops (benchmarks/op_allocations_cpu.py)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    policy = precision_policy(plan.precision, "cpu")
    phases = _PhaseClock()
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = build_model(spec, "cpu", attention=plan.attention, batch_size=plan.batch_size, seq_len=plan.seq_len)
        model = prepare_model(model, plan, policy, spec.task)
        optimizer = build_optimizer(plan, model, "cpu")
        _create_optimizer_state(model, optimizer)
        gc.collect()
        weights = _unique_bytes(model.parameters())
        buffers = _unique_bytes(model.buffers(), exclude=_pointers(model.parameters()))
        optimizer_before = _optimizer_bytes(optimizer)
        with record_function(STEP_RANGE):
            measured = _run_step(model, optimizer, plan, policy, spec, generator, phases)
        optimizer_after = _optimizer_bytes(optimizer)
    if optimizer_after != optimizer_before:
        raise AssertionError(f"optimizer state changed size in a steady-state step: "
                             f"{optimizer_before} -> {optimizer_after} bytes")
    events = prof.profiler.kineto_results.events()
    if events_out is not None:
        events_out.extend(events)
    peak, at_start, peak_ns = peak_in_step(events)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return MeasuredStep(params=params, trainable_params=trainable, weights=weights, buffers=buffers,
                        gradients=measured["gradients"], optimizer=optimizer_after,
                        activations=max(measured["activations"]), peak_allocated=peak,
                        live_at_step_start=at_start, peak_phase=_PhaseClock.phase_at(events, peak_ns),
                        activations_per_micro_step=measured["activations"])


# ---------------------------------------------------------------------------- the step
def _create_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _run_step(model, optimizer, plan: Plan, policy, spec: ModelSpec, generator, phases) -> dict:
    activations = []
    for _ in range(plan.grad_accum):
        phases.enter("data")
        batch = example_batch(spec, plan.batch_size, plan.seq_len, device="cpu", generator=generator,
                              documents=plan.packing == "documents")
        phases.enter("forward")
        saved = _SavedStorages(exclude=_pointers([*model.parameters(), *model.buffers()]))
        with saved, _autocast(policy), observe_kept(saved.pack):
            loss = compute_loss(model, batch) / plan.grad_accum
        activations.append(saved.peak_alive())
        phases.enter("backward")
        loss.backward()
        del loss, batch, saved
    phases.enter("optimizer")
    trainable = [p for p in model.parameters() if p.grad is not None]
    gradients = _unique_bytes(p.grad for p in trainable)
    if plan.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(trainable, plan.max_grad_norm, foreach=True)
    optimizer.step()
    phases.enter("zero_grad")
    optimizer.zero_grad(set_to_none=True)
    phases.enter("end")
    return {"activations": activations, "gradients": gradients}


def _autocast(policy):
    if policy.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=policy.autocast_dtype)


class _SavedStorages:
    """Storages autograd packs while active, each counted once while it is alive."""

    def __init__(self, exclude: set[int]):
        self._exclude = exclude
        self._alive: dict[int, tuple[weakref.ref, int]] = {}  # id(storage) -> (ref, nbytes)
        self._peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._peak = max(self._peak, self.alive_bytes())

    def pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._exclude and storage.nbytes() > 0 and id(storage) not in self._alive:
            key = id(storage)
            self._alive[key] = (weakref.ref(storage, lambda _r, k=key: self._alive.pop(k, None)), storage.nbytes())
            self._peak = max(self._peak, self.alive_bytes())
        return tensor

    def alive_bytes(self) -> int:
        return sum(nbytes for ref, nbytes in self._alive.values() if ref() is not None)

    def peak_alive(self) -> int:
        return self._peak


class _PhaseClock:
    """Marks phase changes on the profiler's own clock (a zero-length `record_function`
    range per change), so the phase of the peak can be read back from the profile."""

    PREFIX = "trainwise.reference.phase."

    def enter(self, phase: str) -> None:
        with record_function(self.PREFIX + phase):
            pass

    @classmethod
    def phase_at(cls, events, ns: int) -> str:
        starts = sorted((e.start_ns(), e.name()[len(cls.PREFIX):]) for e in events
                        if e.name().startswith(cls.PREFIX))
        phase = "setup"
        for start, name in starts:
            if start <= ns:
                phase = name
        return phase


def peak_in_step(events) -> tuple[int, int, int]:
    """(peak live bytes inside the step range, live bytes at its start, time of the peak).

    `events` are the kineto events of a profile started before anything of the run was
    allocated, so the running sum of the "[memory]" deltas is the live tensor memory."""
    window = [e for e in events if e.name() == STEP_RANGE]
    if len(window) != 1:
        raise RuntimeError(f"expected one '{STEP_RANGE}' range in the profile, found {len(window)}")
    start, end = window[0].start_ns(), window[0].end_ns()
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = 0
    for ns, delta in deltas:
        if ns >= start:
            break
        live += delta
    at_start = peak = live
    peak_ns = start
    for ns, delta in deltas:
        if ns < start:
            continue
        if ns > end:
            break
        live += delta
        if live > peak:
            peak, peak_ns = live, ns
    return peak, at_start, peak_ns


# ---------------------------------------------------------------------------- storage sums
def _pointers(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def _unique_bytes(tensors, exclude: set[int] = frozenset()) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _unique_bytes(t for state in optimizer.state.values() for t in state.values()
                         if isinstance(t, torch.Tensor))
