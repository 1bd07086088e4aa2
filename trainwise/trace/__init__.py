"""Trace: one training step on fake tensors -> StepTrace (allocations by category and module);
its model FLOPs counted the same way (flops.py)."""
