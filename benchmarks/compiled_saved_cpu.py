"""What a compiled CPU step saves for backward, beside the eager step: for finding why the
compiled step's peak is below the eager estimate (docs/estimate.md, "Compiled steps").

For each scope asked (eager, per-block compile, whole-model compile) one model is built,
a first step runs (it compiles), and on the second step the autograd graph is walked right
after the forward: every tensor a backward node holds (an eager node's `_saved_*`, or a
compiled region's `saved_tensors`) is counted once per storage, weights and buffers left
out. The same step's peak is measured as `trainwise train` measures its CPU probe step
(live tensors at the start + the highest running sum of the profiler's allocations).
Printed: the peak and the saved total per scope, then the saved storages grouped by
(bytes, dtype, the nodes that hold them), so the groups that differ can be read off.

    python benchmarks/compiled_saved_cpu.py tiny-llama --seq-len 64 --batch-size 4
    python benchmarks/compiled_saved_cpu.py tiny-gpt2 --seq-len 64 --scopes eager,blocks,model
"""

from __future__ import annotations

import argparse
import collections
import sys

import provenance

provenance.add_repo_to_path()
sys.path.insert(0, str(provenance.REPO / "tests"))  # the measured step: tests/compiled_step.py

import torch  # noqa: E402

from trainwise.plan.plan import Plan  # noqa: E402


def saved_storages(loss: torch.Tensor, exclude: set[int]) -> dict[int, tuple[int, str, set[str]]]:
    """data_ptr -> (bytes, dtype, names of the backward nodes holding it), over the graph."""
    found: dict[int, tuple[int, str, set[str]]] = {}
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for tensor in _held(node):
            storage = tensor.untyped_storage()
            if storage.data_ptr() in exclude or storage.nbytes() == 0:
                continue
            entry = found.setdefault(storage.data_ptr(), (storage.nbytes(), str(tensor.dtype), set()))
            entry[2].add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def _held(node) -> list[torch.Tensor]:
    values = [getattr(node, name, None) for name in dir(node) if name.startswith("_saved_")]
    if hasattr(node, "saved_tensors"):  # a custom autograd.Function: AOTAutograd's compiled region
        values.extend(node.saved_tensors)
    flat = []
    for value in values:
        flat.extend(value if isinstance(value, (tuple, list)) else [value])
    return [t for t in flat if isinstance(t, torch.Tensor)]


def measure(name: str, plan: Plan) -> tuple[int, dict]:
    """(peak of the second step, saved storages after its forward)."""
    from compiled_step import second_step_peak

    return second_step_peak(name, plan, after_forward=saved_storages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--scopes", default="eager,blocks", help="comma-separated: eager, blocks, model")
    args = parser.parse_args()
    base = Plan(device="cpu", batch_size=args.batch_size, seq_len=args.seq_len, precision=args.precision)
    results = {}
    for scope in args.scopes.split(","):
        plan = base if scope == "eager" else base.replace(compile=True, compile_scope=scope)
        results[scope] = measure(args.model, plan)
        peak, saved = results[scope]
        print(f"{scope:>6}: peak {peak:>11,} B   saved for backward {sum(v[0] for v in saved.values()):>11,} B")
    for scope, (_, saved) in results.items():
        groups = collections.Counter((nbytes, dtype.removeprefix("torch."), ",".join(sorted(nodes)))
                                     for nbytes, dtype, nodes in saved.values())
        print(f"\n{scope}: saved storages (count x bytes, dtype, held by)")
        for (nbytes, dtype, nodes), count in sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[1]):
            print(f"  {count:>3} x {nbytes:>9,}  {dtype:<8} {nodes}")


if __name__ == "__main__":
    main()
