"""Trace: one training step on fake tensors -> StepTrace (allocations by category and module)."""
