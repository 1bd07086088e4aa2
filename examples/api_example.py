"""trainwise from Python: predict one plan's memory, search the plans that fit, then train
the best on this machine. Runs on a CPU in about a minute (tiny-llama, the built-in corpus).

    python examples/api_example.py [OUTPUT_DIR]
"""

from __future__ import annotations

import sys

from trainwise.api import estimate, train
from trainwise.api.search import plan_search
from trainwise.common.units import human_bytes
from trainwise.engine.run_config import RunConfig
from trainwise.plan import Plan


def main(output: str = "runs/api-example") -> None:
    # 1. Predict: the memory of one step of a 1B model on an H100 (no GPU needed here).
    plan = Plan(device="H100", batch_size=4, seq_len=2048, precision="bf16", optim="adamw-fused")
    result = estimate("Llama-3.2-1B", plan)
    fits = result.memory.device_total <= result.device.memory_bytes
    print(f"Llama-3.2-1B on {result.device.name}: {human_bytes(result.memory.device_total)} device total "
          f"(predicted), {'fits' if fits else 'does not fit'} {human_bytes(result.device.memory_bytes)} (catalog)")

    # 2. Plan: every plan of tiny-llama on this CPU for 8 sequences per step; the fitting ones ranked.
    report = plan_search("tiny-llama", Plan(device="cpu", seq_len=64), global_batch=8, top=2)
    best = report.result.ranked[0]
    print(f"searched {len(report.result.screened)} plans; best: micro-batch {best.plan.batch_size} x "
          f"{best.plan.grad_accum} accumulation, {best.plan.precision}, {human_bytes(best.memory_bytes)} (predicted)")

    # 3. Train the best plan for a few steps; the summary sets measured memory beside predicted.
    trained = train("tiny-llama", data="builtin", plan=best.plan, run=RunConfig(steps=4, output=output))
    summary, predicted = trained.summary, (trained.predicted or {}).get("peak_allocated")
    print(f"trained {trained.run.steps} steps: final loss {summary['final_loss']:.3f} (measured); peak allocated "
          f"{human_bytes(summary['peak_allocated'])} measured, {human_bytes(predicted)} predicted")

if __name__ == "__main__":
    main(*sys.argv[1:2])
