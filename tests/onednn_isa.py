"""Measure one real CPU step (tests/memory_reference.py) in a fresh process whose oneDNN is
capped to an instruction set.

Why: on a CPU with AVX512-BF16 or AMX, PyTorch sends bf16 matmuls, convolutions and the
flash-attention kernel's blocks to oneDNN, and oneDNN takes a scratchpad for each call from
PyTorch's CPU allocator. Its size follows the kernel oneDNN picks for the instruction set
and the thread count, not the op's shapes alone, so the trace cannot show it
(docs/estimate.md, *Tasks beyond text*). With oneDNN capped at AVX2 it has no bf16 kernels,
PyTorch runs its own bf16 kernels, and what remains is what the trace models.

oneDNN reads its cap (`ONEDNN_MAX_CPU_ISA`) once per process, before its first kernel, so
the steps run in a child process, all of them in one (each step is measured on its own, as
the tests measure one step after another in theirs). The cap names x86 instruction sets only."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from memory_reference import MeasuredStep

REPO = Path(__file__).resolve().parents[1]
WITHOUT_BF16_KERNELS = "AVX2"  # the highest x86 cap under which oneDNN has no bf16 kernels
CAN_CAP = platform.machine().lower() in ("x86_64", "amd64")


def measure_steps_capped(steps: list[tuple[str, str | None, dict]], isa: str) -> tuple[list[MeasuredStep], bool]:
    """`measure_step` of each (model, task it is resolved for, plan as Plan.to_dict()) of
    `steps`, in order, in one process with oneDNN capped at `isa`; also whether oneDNN still
    had bf16 kernels there."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa,
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    request = json.dumps([{"model": model, "task": task, "plan": plan} for model, task, plan in steps])
    done = subprocess.run([sys.executable, __file__, request], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the capped measurement failed:\n{done.stderr[-3000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return [MeasuredStep(**measured) for measured in answer["measured"]], answer["onednn_bf16"]


def _child(request: str) -> None:
    import torch

    from memory_reference import measure_step
    from trainwise.models import resolve_model
    from trainwise.plan.plan import Plan

    measured = [measure_step(resolve_model(step["model"], task=step["task"]), Plan.from_dict(step["plan"])).as_dict()
                for step in json.loads(request)]
    print(json.dumps({"measured": measured, "onednn_bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported()}))


if __name__ == "__main__":
    _child(sys.argv[1])
