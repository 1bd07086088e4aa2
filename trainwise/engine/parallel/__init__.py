"""Parallel layouts on PyTorch's own engine: torchrun, DeviceMesh, DDP, FSDP2, DTensor
tensor parallel, torch.distributed.pipelining, torch.distributed.checkpoint.

The order layouts are applied in (apply.py): tensor parallel -> pipeline split ->
activation checkpointing (with the rest of the single-device recipe) -> compile ->
sharded or replicated data parallel -> optimizer."""
