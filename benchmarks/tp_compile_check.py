"""What one GPU can check of per-block torch.compile and float8 over tensor-parallel blocks
(the `tp-compile` stage of benchmarks/gpu_validation.sh).

One GPU holds a tensor-parallel mesh of one rank only, so this runs trainwise's own
tensor-parallel split (engine/parallel/tensor_parallel.py) of tiny-llama on a 1-rank mesh
(NCCL): every weight a DTensor, the embedding's all-reduce and the loss's vocab-parallel
cross-entropy run as they do at tp > 1, over one rank. Four variants train the same batches:

* eager: the split model, bf16 autocast;
* compiled: the same, each block compiled (engine/compile_regions.py) with inductor's CUDA
  backend; its losses must equal eager's within 2 % relative (bf16: the fused kernels
  round differently);
* float8 eager and float8 compiled (CUDA compute capability 8.9+ with torchao, else
  recorded as skipped with the reason): the split projections converted first and split
  with torchao's float8 styles; each loss within 5 % of the bf16 eager one (float8
  rounding of every converted matmul), all finite.

What it proves: inductor compiles DTensor blocks, forward and backward, on CUDA, and
torchao's float8 styles run compiled on trainwise's split. What it cannot: any cross-rank
traffic of tp >= 2 (one rank sends nothing), and speed (nothing is timed). Unmeasured
until a GPU runs it.

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/tp_compile_check.py --out DIR/tp-compile.json

Without a CUDA GPU it prints "skipped: no CUDA GPU" and exits 0. `--device cpu` runs on gloo
over as many ranks as torchrun starts (tp = the world size), float8 included where torchao
is installed (torch 2.13 has CPU float8 matmuls: the numerics, not the speed); the tests use
it (tests/test_float8_tensor_parallel.py). `--only` picks variants by name. Exits 1 if a
check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import provenance
import torch

provenance.add_repo_to_path()

COMPILE_TOLERANCE = 0.02
FLOAT8_TOLERANCE = 0.05


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per variant")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--only", default=None, help="comma-separated variants to run (default: all)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: no CUDA GPU")
        return 0
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        if args.device == "cuda":
            torch.cuda.set_device(0)
        mesh = init_device_mesh(args.device, (dist.get_world_size(),))
        wanted = None if args.only is None else {"eager", *args.only.split(",")}  # eager: the reference
        chosen = [(name, knobs) for name, knobs in VARIANTS if wanted is None or name in wanted]
        results = {name: run_variant(mesh, args.device, args.steps, **knobs) for name, knobs in chosen}
        rank = dist.get_rank()
    finally:
        dist.destroy_process_group()
    if rank != 0:  # every rank computed the same losses; rank 0 reports them
        return 0
    checks = judge(results)
    report = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "variants": results, "checks": checks, "source": "measured"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for name, check in checks.items():
        print(f"{name}: {'ok' if check['ok'] else 'FAILED'} ({check['detail']})")
    return 0 if all(check["ok"] for check in checks.values()) else 1


VARIANTS = (("eager", {"compiled": False, "float8": False}), ("compiled", {"compiled": True, "float8": False}),
            ("float8 eager", {"compiled": False, "float8": True}), ("float8 compiled", {"compiled": True, "float8": True}))


def float8_unavailable(device: str) -> str | None:
    """Why float8 cannot run here, or None."""
    if device == "cuda" and torch.cuda.get_device_capability(0) < (8, 9):
        return "compute capability below 8.9"
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "torchao is not installed"
    return None


def run_variant(mesh, device: str, steps: int, compiled: bool, float8: bool) -> dict:
    """Train tiny-llama split over `mesh` for `steps` steps; its losses and what was built."""
    if float8 and (reason := float8_unavailable(device)):
        return {"skipped": reason}
    from trainwise.engine.compile_regions import compile_blocks
    from trainwise.engine.parallel.tensor_parallel import (apply_tensor_parallel, convert_float8_before_split,
                                                          keep_embedding_gradient_sharded, tensor_parallel_loss)
    from trainwise.models.build import build_model
    from trainwise.models.resolve import resolve_model
    from trainwise.plan.plan import Plan

    spec = resolve_model("tiny-llama")
    torch.manual_seed(0)
    model = build_model(spec, "cpu")
    if float8:
        tp = mesh.size()
        model = convert_float8_before_split(model, Plan(device="h100", precision="bf16", float8=True), tp)
    model = apply_tensor_parallel(model.to(device), mesh)
    keep_embedding_gradient_sharded(model)
    blocks = compile_blocks(model, None) if compiled else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        ids = torch.randint(0, spec.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(step))
        ids = ids.to(device)
        with tensor_parallel_loss(model), torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float((loss.full_tensor() if hasattr(loss, "full_tensor") else loss).detach()))
    q_proj = model.model.layers[0].self_attn.q_proj
    return {"losses": losses, "compiled_blocks": blocks, "q_proj": type(q_proj).__name__,
            "q_proj_weight": type(q_proj.weight).__name__}


def judge(results: dict) -> dict:
    """Each check: ok and what it compared."""
    reference = results["eager"]["losses"]
    checks = {}
    if "compiled" in results:
        checks["compiled DTensor blocks match eager"] = _close(results["compiled"], reference, COMPILE_TOLERANCE)
    for name in ("float8 eager", "float8 compiled"):
        if name in results:
            checks[f"{name} near bf16 eager"] = _close(results[name], reference, FLOAT8_TOLERANCE)
    return checks


def _close(result: dict, reference: list[float], tolerance: float) -> dict:
    if "skipped" in result:
        return {"ok": True, "detail": f"skipped: {result['skipped']}"}
    losses = result["losses"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
    ok = all(math.isfinite(x) for x in losses) and worst <= tolerance
    return {"ok": ok, "detail": f"largest relative difference {worst:.2e}, tolerance {tolerance}"}


if __name__ == "__main__":
    raise SystemExit(main())
