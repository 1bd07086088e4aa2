"""Training faults: a loss that is not a number, explained rather than just reported."""

from __future__ import annotations

from trainwise.plan.plan import Plan

# fp16 with loss scaling skips an overflowing step by itself; only a run of them means
# the scale cannot recover (the model really diverged, or fp16's range is too small).
MAX_CONSECUTIVE_SCALER_SKIPS = 20


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite and the run was told to stop (exit code 1)."""

    def __init__(self, step: int, loss: float, diagnosis: str):
        self.step, self.loss, self.diagnosis = step, loss, diagnosis
        super().__init__(f"loss is {loss} at step {step}: {diagnosis}")


def diagnose_non_finite(plan: Plan, persistent_fp16: bool = False) -> str:
    """The likely cause of a NaN/inf loss under `plan`, with what to try."""
    if plan.precision == "fp16":
        why = "fp16 overflow that loss scaling could not recover from" if persistent_fp16 else "fp16 overflow"
        return f"{why}; use --precision bf16 (same memory, fp32's range) or a lower --lr (now {plan.lr:g})"
    hints = [f"a lower --lr (now {plan.lr:g})"]
    if plan.warmup_steps == 0:
        hints.append("--warmup-steps > 0")
    if plan.max_grad_norm == 0:
        hints.append("--max-grad-norm 1.0")
    if plan.precision == "bf16-pure":
        hints.append("--precision bf16 (fp32 master weights)")
    return "the optimisation diverged or the data holds bad values; try " + ", ".join(hints) + \
           " (or --on-nan skip to skip such steps)"
