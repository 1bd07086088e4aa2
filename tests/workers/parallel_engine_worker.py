"""Runs under torchrun: trains each case of argv[1] (a JSON list of {"name", "model",
"knobs", "steps"}) with trainwise.api.train and writes every case's loss curve (or its
error) for the test to compare with one process, and the bytes this rank held in
weights, gradients and optimizer states just before its last optimizer step and its
measured peak, for the per-rank estimate to be checked against."""

import copy
import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from distributed_launch import write_result  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402

from trainwise.api.training import train  # noqa: E402
from trainwise.engine.parallel.mesh import stop_distributed  # noqa: E402
from trainwise.engine.run_config import RunConfig  # noqa: E402
from trainwise.models import resolve_model  # noqa: E402
from trainwise.plan.plan import Plan  # noqa: E402


def model_spec(case: dict):
    """The case's catalog model, with its config changed where the case says (dropout 0:
    layouts that split a layer draw dropout masks differently from one process)."""
    spec = resolve_model(case["model"])
    if not case.get("config"):
        return spec
    config = copy.deepcopy(spec.config)
    for key, value in case["config"].items():
        setattr(config, key, value)
    return dataclasses.replace(spec, config=config, vocab_size=getattr(config, "vocab_size", spec.vocab_size))


def state_bytes(optimizer) -> dict:
    """Bytes of this rank's trainable weights, gradients and optimizer states (local shards;
    storages counted once, so views into DDP buckets or FSDP's flat buffers add no more)."""
    def total(tensors) -> int:
        storages = {}
        for tensor in tensors:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
        return sum(storages.values())

    params = [p for group in optimizer.param_groups for p in group["params"]]
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own shard
    states = [t for state in inner.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    return {"weights": total(params), "gradients": total(p.grad for p in params if p.grad is not None),
            "optimizer": total(states)}


def main() -> None:
    cases = json.loads(sys.argv[1])
    rank = os.environ["RANK"]
    results = {}
    for case in cases:
        losses = []
        if case.get("fail_on_rank") == rank:
            raise RuntimeError(f"rank {rank} fails on purpose")
        knobs = {**case["knobs"], **case.get("rank_knobs", {}).get(rank, {})}
        snapshots = []
        hook = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: snapshots.append(state_bytes(optimizer)))
        try:
            trained = train(model_spec(case), plan=Plan.from_dict({**knobs, "device": "cpu"}),
                            run=RunConfig.from_dict({"steps": case["steps"], "data": "synthetic", "timing_warmup": 0}),
                            on_step=lambda entry: losses.append(entry.outcome.loss))
            # ZeRO-1 steps twice per step (its own step, then its shard's optimizer): the
            # largest of the last two is the whole picture.
            last = snapshots[-2:]
            results[case["name"]] = {"losses": losses, "state_bytes": {k: max(s[k] for s in last) for k in last[0]},
                                     "peak_allocated": trained.summary.get("peak_allocated")}
        except Exception as err:  # noqa: BLE001 - reported per case to the test
            results[case["name"]] = {"error": f"{type(err).__name__}: {err}",
                                     "traceback": traceback.format_exc()[-2000:]}
        finally:
            hook.remove()
    write_result(results)
    stop_distributed()


if __name__ == "__main__":
    main()
