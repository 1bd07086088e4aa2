"""Parallel layouts on PyTorch's own engine: torchrun, DeviceMesh, DDP, FSDP2, DTensor
tensor parallel, torch.distributed.pipelining, torch.distributed.checkpoint, and the
one-process `--classic` layouts.

The order layouts are applied in is engine/parallelize.py's: tensor parallel -> the step
recipe (activation checkpointing among it) -> pipeline split -> compile -> sharded or
replicated data parallel (or a classic layout) -> optimizer. apply.py holds the layout's
own steps of that order."""
