"""engine/compile_atomic_add.py: a CPU compile on more than one thread runs scatter-adds in
ATen, because the torch releases trainwise supports generate them wrong there."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from trainwise.engine import compile_atomic_add
from trainwise.engine.compile_regions import compile_model_parts
from trainwise.plan.plan import Plan

# Falcon's attention reduced: the key head picked from a packed projection by an index
# tensor, rotated, scored against the queries. Its backward is an accumulating index_put
# that reads the key's gradient transposed. Prints the largest gradient difference between
# the compiled and the eager function on 2 threads.
REDUCED_CASE = textwrap.dedent("""
    import sys
    import torch
    from trainwise.engine.compile_atomic_add import run_scatter_adds_in_aten
    torch.set_num_threads(2)
    if sys.argv[1] == "switched":
        assert run_scatter_adds_in_aten("cpu")
    torch.manual_seed(0)
    def scores(qkv, cos, sin):
        q = qkv[:, :, :6].transpose(1, 2)
        k = qkv[:, :, torch.tensor([6])].transpose(1, 2)
        half = k.shape[-1] // 2
        k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
        return q @ k.transpose(-1, -2)
    qkv = torch.randn(8, 64, 8, 32, requires_grad=True)
    cos, sin, w = torch.randn(1, 1, 64, 32), torch.randn(1, 1, 64, 32), torch.randn(8, 6, 64, 64)
    def grad(fn):
        qkv.grad = None
        (fn(qkv, cos, sin) * w).sum().backward()
        return qkv.grad.clone()
    eager = grad(scores)
    print((eager - grad(torch.compile(scores))).abs().max().item())
""")


@pytest.fixture(autouse=True)
def not_yet_switched(monkeypatch):
    """This process has not turned the switch on (conftest gives back torch's state after)."""
    monkeypatch.setattr(compile_atomic_add, "_applied_threads", None)


def test_only_a_cpu_compile_on_more_than_one_thread_needs_the_switch(monkeypatch):
    torch.use_deterministic_algorithms(False)  # as a process starts (an earlier test's module may have left it on)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert compile_atomic_add.needs_switch("cpu")
    assert not compile_atomic_add.needs_switch("cuda")  # Triton's atomics, not this C++ path
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert not compile_atomic_add.needs_switch("cpu")  # one thread: inductor writes a plain add
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    torch.use_deterministic_algorithms(True)  # --deterministic: inductor falls back already
    assert not compile_atomic_add.needs_switch("cpu")
    assert not compile_atomic_add.run_scatter_adds_in_aten("cpu")
    assert compile_atomic_add.switch_note() is None
    assert not torch.is_deterministic_algorithms_warn_only_enabled()  # the user's strict mode is kept


def test_compiling_for_the_cpu_turns_the_switch_on_warn_only_without_the_nan_fill(monkeypatch):
    torch.use_deterministic_algorithms(False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    block = nn.Linear(4, 4)
    compile_model_parts([nn.Sequential(block)], Plan(device="cuda", compile=True, compile_scope="model"), in_place=False)
    assert not torch.are_deterministic_algorithms_enabled()
    compile_model_parts([nn.Sequential(block)], Plan(device="cpu", compile=True, compile_scope="model"), in_place=False)
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert "2 threads" in compile_atomic_add.switch_note()


def _reduced_case(mode: str) -> subprocess.CompletedProcess:
    """REDUCED_CASE in a fresh process (a wrong kernel may corrupt its heap), compiled afresh."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    return subprocess.run([sys.executable, "-c", REDUCED_CASE, mode], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.slow
def test_the_switch_makes_the_compiled_scatter_add_match_eager_where_torch_gets_it_wrong():
    switched = _reduced_case("switched")
    assert switched.returncode == 0, switched.stderr[-2000:]
    assert float(switched.stdout.split()[-1]) < 1e-4
    # Without the switch this torch writes the gradient to the wrong rows (or past the
    # buffer: the process may die). Once this fails, the installed torch holds the fix and
    # compile_atomic_add can be retired for it.
    plain = _reduced_case("plain")
    wrong = plain.returncode != 0 or float(plain.stdout.split()[-1]) > 1e-2
    assert wrong, "the installed torch compiles the reduced case right without the switch"
