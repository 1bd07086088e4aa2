"""Throughput of a whole job and of one of its GPUs: one meaning for every figure.

`tokens_per_s` and `samples_per_s` are the job's (every rank's samples); the per-GPU figures
divide them by the job's devices. A class that reports throughput inherits `JobRates` and
has those two fields and `gpus`."""

from __future__ import annotations


class JobRates:
    """The per-GPU figures of a class holding `tokens_per_s`, `samples_per_s` (the job's) and `gpus`."""

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def samples_per_s_per_gpu(self) -> float:
        return self.samples_per_s / self.gpus
