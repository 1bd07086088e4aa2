"""A CPU training process keeps the memory it frees (trainwise/hardware/allocator.py): glibc's
default unmaps a step's large buffers and trims its heap, and the next step faults the
same memory in afresh. A user's own allocator choice is left alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainwise.hardware.allocator import KEPT, NOT_GLIBC, USER_GLIBC, allocator_setting

# Frees and allocates a 40 MiB tensor as a step frees and remakes its activations (a
# GPT-2 logits tensor at 4 x 128 tokens is 100 MiB), and prints the page faults the loop
# took once warm: glibc's default maps each one afresh (10,240 pages; its mmap threshold
# rises to 32 MiB at most), kept memory is reused.
_LOOP = """
import json, resource, sys
sys.path.insert(0, {root!r})
from trainwise.hardware.allocator import keep_freed_memory
setting = keep_freed_memory() if {keep} else "default"
import torch
for _ in range(15):
    torch.empty(10 << 20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.empty(10 << 20).fill_(1.0)
print(json.dumps({{"setting": setting, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}}))
"""


def _faults(keep: bool, tmp_path) -> dict:
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = {key: value for key, value in __import__("os").environ.items() if not key.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _LOOP.format(root=root, keep=keep)], capture_output=True,
                         text=True, check=True, env=env, cwd=tmp_path)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or allocator_setting() != KEPT,
                    reason="glibc's allocator with no MALLOC_* setting or preload in the environment")
def test_freed_memory_is_reused_without_page_faults_once_kept(tmp_path):
    default, kept = _faults(False, tmp_path), _faults(True, tmp_path)
    assert kept["setting"] == KEPT
    assert default["faults"] > 20 * 10_000  # each 40 MiB tensor mapped and faulted in afresh
    assert kept["faults"] < 200


@pytest.mark.parametrize("environ, libc, expected", [
    ({}, "glibc", KEPT),
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, "glibc", USER_GLIBC),
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, "glibc", USER_GLIBC),
    ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, "glibc", KEPT),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "glibc", "jemalloc (LD_PRELOAD)"),
    ({}, "", NOT_GLIBC),
])
def test_the_users_own_allocator_settings_win(environ, libc, expected):
    assert allocator_setting(environ, libc) == expected


def test_a_cpu_run_says_how_the_allocator_was_set():
    from trainwise.api import train
    from trainwise.engine.run_config import RunConfig
    from trainwise.plan.plan import Plan

    result = train("tiny-llama", plan=Plan(device="cpu", seq_len=16, batch_size=2), run=RunConfig(steps=1))
    assert any(note.startswith("CPU allocator: ") for note in result.notes)
