"""Runs under torchrun: trains each case of argv[1] (a JSON list of {"name", "model",
"knobs", "steps"}) with trainwise.api.train and writes every case's loss curve (or its
error) for the test to compare with one process."""

import copy
import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_launch import write_result  # noqa: E402

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
    return dataclasses.replace(spec, config=config)


def main() -> None:
    cases = json.loads(sys.argv[1])
    rank = os.environ["RANK"]
    results = {}
    for case in cases:
        losses = []
        if case.get("fail_on_rank") == rank:
            raise RuntimeError(f"rank {rank} fails on purpose")
        knobs = {**case["knobs"], **case.get("rank_knobs", {}).get(rank, {})}
        try:
            train(model_spec(case), plan=Plan.from_dict({**knobs, "device": "cpu"}),
                  run=RunConfig.from_dict({"steps": case["steps"], "data": "synthetic", "timing_warmup": 0}),
                  on_step=lambda entry: losses.append(entry.outcome.loss))
            results[case["name"]] = {"losses": losses}
        except Exception as err:  # noqa: BLE001 - reported per case to the test
            results[case["name"]] = {"error": f"{type(err).__name__}: {err}",
                                     "traceback": traceback.format_exc()[-2000:]}
    write_result(results)
    stop_distributed()


if __name__ == "__main__":
    main()
