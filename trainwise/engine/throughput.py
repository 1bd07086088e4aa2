"""Throughput of a run: step durations and the samples/s, tokens/s and MFU they imply."""

from __future__ import annotations

from trainwise.engine.flops import mfu


class StepTimer:
    """Optimizer-step durations in seconds, as the loop measured them (after a device
    synchronisation, so queued GPU work is included; on a GPU the loop synchronises only
    at read points and at the end of the warm-up, and each step of such a window is
    recorded with the window's mean: engine/pending_steps.py).

    Steps recorded with `timed=False` (the warm-up steps, where allocator growth happens,
    and the CPU memory-probe step, which runs under the profiler) count in the run's total
    time but not in its rates; steps recorded with `compiled=True` (torch.compile traced,
    compiled or loaded code from its cache during them) are summed apart as compile_s and
    are never timed. `flops_per_step` is the counted model FLOPs
    of one optimizer step (FlopCount.total x grad_accum); `peak_flops` the device's peak
    FLOP/s for the plan's precision (flops.peak_flops_for); either None: no MFU.

    `samples_per_step` and `tokens_per_step` are the whole job's (every data-parallel
    replica's), so `samples_per_s` and `tokens_per_s` are the job's; `gpus` is the job's
    device count (its processes), and the `*_per_gpu` rates are the job's over them."""

    def __init__(self, *, samples_per_step: int, tokens_per_step: int, flops_per_step: int | None,
                 peak_flops: float | None, gpus: int = 1):
        self.samples_per_step, self.tokens_per_step, self.gpus = samples_per_step, tokens_per_step, gpus
        self.flops_per_step, self.peak_flops = flops_per_step, peak_flops
        self.timed: list[float] = []
        self.untimed: list[float] = []
        self.compiling: list[float] = []

    def record(self, seconds: float, timed: bool, compiled: bool = False) -> None:
        (self.compiling if compiled else self.timed if timed else self.untimed).append(seconds)

    def mfu_for(self, seconds: float) -> float | None:
        """MFU (a fraction) of one step that took `seconds`; None without FLOPs or a peak."""
        if self.flops_per_step is None or seconds <= 0:
            return None
        return mfu(self.flops_per_step / seconds, self.peak_flops)

    def rates(self, seconds: float | None) -> dict:
        """samples_per_s and tokens_per_s of the job, and per GPU, for steps of `seconds`
        (None without a step time)."""
        if not seconds:
            return dict.fromkeys(("samples_per_s", "tokens_per_s", "samples_per_s_per_gpu", "tokens_per_s_per_gpu"))
        samples, tokens = self.samples_per_step / seconds, self.tokens_per_step / seconds
        return {"samples_per_s": samples, "tokens_per_s": tokens, "samples_per_s_per_gpu": samples / self.gpus,
                "tokens_per_s_per_gpu": tokens / self.gpus}

    def summary(self, total_time_s: float) -> dict:
        """time_s (the whole run, seconds), the rates over the timed steps, the mean
        step time (seconds), how many steps were timed and each timed step's seconds
        (`step_times_s`, so a reader can judge their spread). With no timed step (a run
        shorter than its warm-up) the rates use every step and `rates_include_warmup`
        says so. `compile_s` is the wall seconds of the steps that compiled (their own
        compute included), `compile_steps` how many; None and 0 when nothing compiled."""
        durations = self.timed or self.untimed or self.compiling
        per_step = sum(durations) / len(durations) if durations else None
        return {"time_s": total_time_s, **self.rates(per_step), "gpus": self.gpus,
                "mfu": self.mfu_for(per_step) if per_step else None,
                "step_time_s": per_step,
                "timed_steps": len(self.timed),
                "step_times_s": [round(seconds, 6) for seconds in self.timed],
                "rates_include_warmup": not self.timed,
                "compile_s": sum(self.compiling) if self.compiling else None,
                "compile_steps": len(self.compiling)}
