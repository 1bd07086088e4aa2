"""trainwise's fastest plan against the Trainer's competent hand configuration (issue 17).

Unlike benchmarks/vs_hf_trainer.py, which runs one plan through both engines, the two
sides here run different plans, each at the largest micro-batch that fits:

* the Trainer: bf16 mixed precision, fused AdamW, SDPA attention, no checkpointing (what a
  careful user sets by hand);
* trainwise: the knobs given as flags (e.g. --kernels liger --float8 --compile ...).

Each side's micro-batch is found first, a short run each (a --batch-size flag is replaced
by it): by default the --batch-sizes in ascending order, the first that does not finish
ending the search; with --start predicted the search starts at the largest size the
estimate says fits and walks up while runs finish, down while they fail, so a launch
usually spends two runs per side instead of one per size (the estimate only picks where to
start: what is reported is what ran). Then the two run alternately in fresh processes and
the launch prints tokens/s (real tokens: samples/s x seq_len), MFU and peak allocated memory
of each, and their ratios measured side by side. With --fit-only only trainwise's largest
batch is found and printed (the Llama-3.1-8B seq 4096 fit of the issue). The rows file is
written after each phase, so a launch stopped by its time limit keeps what it measured.

    python benchmarks/engine_speed.py Llama-3.2-1B --seq-len 2048 --kernels liger --float8 --compile \\
        --precision bf16 --optim adamw-fused --rows DIR/engine-speed-rows.json

Needs a CUDA GPU; without one it prints "skipped: no CUDA GPU" and exits 0. Measured only
where a GPU ran it: nothing in the repository states its numbers until a rows file does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import provenance
import torch

provenance.add_repo_to_path()

from trainwise.api.estimate import estimate  # noqa: E402
from trainwise.bench.runner import RowJob, run_row  # noqa: E402
from trainwise.cli.flags import add_knob_flags, plan_from_args, typed_values  # noqa: E402
from trainwise.common.atomic import atomic_write_text  # noqa: E402
from trainwise.plan.plan import Plan  # noqa: E402

TRAINER_HAND = {"precision": "bf16", "optim": "adamw-fused", "attention": "sdpa", "device": "cuda"}


def largest_batch(model: str, task: str | None, plan: Plan, engine: str, sizes: list[int], scratch: Path,
                  timeout: float, start: int = 0) -> dict:
    """{"batch_size": the largest of `sizes` (ascending) whose short run finished, "tried":
    [(batch, status, reason)]}; batch_size None when none did. The search starts at
    sizes[start] and walks up while runs finish, down while they fail."""
    outcome = {}

    def finished(index: int) -> bool:
        batch = sizes[index]
        row = run_row(RowJob(f"fit-{batch}", plan.replace(batch_size=batch), engine, model, 4, 1, 0, task,
                             scratch, timeout))
        outcome[batch] = (row["status"], row.get("reason"))
        print(json.dumps({"search": engine, "batch_size": batch, "status": row["status"],
                          "reason": row.get("reason")}), flush=True)
        return row["status"] == "ok"

    best, index = None, start
    if finished(index):
        best = sizes[index]
        while index + 1 < len(sizes) and finished(index + 1):
            index += 1
            best = sizes[index]
    else:
        while index > 0:
            index -= 1
            if finished(index):
                best = sizes[index]
                break
    return {"batch_size": best, "tried": [(batch, *outcome[batch]) for batch in sorted(outcome)]}


def predicted_start(model: str, task: str | None, plan: Plan, sizes: list[int]) -> dict:
    """{"index": where the search starts (the largest of `sizes` whose predicted device total
    fits the GPU; 0 when none does), "predicted": {batch: predicted device total, bytes}}.
    Estimates run on the host, on the meta device; at most a few per side."""
    device_bytes = torch.cuda.get_device_properties(0).total_memory
    predicted, low, high = {}, 0, len(sizes) - 1  # sizes[low] is where the search starts
    while low < high:
        middle = (low + high + 1) // 2
        result = estimate(model, plan.replace(batch_size=sizes[middle]), task=task)
        predicted[sizes[middle]] = result.memory.device_total
        if result.memory.device_total <= device_bytes:
            low = middle
        else:
            high = middle - 1
    return {"index": low, "predicted": predicted, "device_bytes": device_bytes}


def timed_runs(model: str, task: str | None, plans: dict[str, Plan], steps: int, repeats: int, scratch: Path,
               timeout: float) -> dict[str, list[dict]]:
    """Each side's runs, alternating A B B A ... so drift of the machine hits both alike."""
    runs = {side: [] for side in plans}
    sides = list(plans)
    for index in range(repeats):
        for side in (sides if index % 2 == 0 else reversed(sides)):
            engine = "hf-trainer" if side == "trainer" else "trainwise"
            row = run_row(RowJob(side, plans[side], engine, model, steps, 3, 0, task, scratch, timeout))
            runs[side].append(row)
            print(json.dumps({"side": side, "status": row["status"], "reason": row.get("reason"),
                              "samples_per_s": row.get("samples_per_s"), "mfu": row.get("mfu"),
                              "peak_allocated": row["measured"].get("peak_allocated")}), flush=True)
    return runs


def summary(runs: dict[str, list[dict]], plans: dict[str, Plan]) -> dict:
    """Medians per side (tokens/s, MFU, peak allocated bytes) and trainwise / Trainer ratios."""
    sides = {}
    for side, rows in runs.items():
        ok = [r for r in rows if r["status"] == "ok"]
        if not ok:
            return {"error": f"{side}: {rows[0]['status']}: {rows[0].get('reason')}"}
        sides[side] = {"tokens_per_s": statistics.median(r["samples_per_s"] for r in ok) * plans[side].seq_len,
                       "mfu": statistics.median(r["mfu"] for r in ok) if all(r.get("mfu") for r in ok) else None,
                       "peak_allocated_bytes": statistics.median(r["measured"]["peak_allocated"] for r in ok),
                       "runs": [r["samples_per_s"] * plans[side].seq_len for r in ok],  # tokens/s of each run
                       "plan": plans[side].changed_knobs()}
    mine, theirs = sides["trainwise"], sides["trainer"]
    return {"sides": sides, "tokens_per_s_ratio": round(mine["tokens_per_s"] / theirs["tokens_per_s"], 3),
            "peak_memory_ratio": round(mine["peak_allocated_bytes"] / theirs["peak_allocated_bytes"], 3),
            "measured_with": "medians of fresh-process runs; warm-up steps left out; tokens are real tokens"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="catalog model")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per timed run")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per side (alternated)")
    parser.add_argument("--task", default=None, help="the model's task (default: the catalog's)")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64",
                        help="micro-batches the search tries, ascending; the first that fails ends it")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--start", choices=("smallest", "predicted"), default="smallest",
                        help="where each side's batch search starts: the smallest size, or the largest "
                             "the estimate says fits")
    parser.add_argument("--fit-only", action="store_true", help="only find trainwise's largest batch")
    parser.add_argument("--rows", type=Path, default=None, help="append this launch's result to this JSON file")
    add_knob_flags(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU")
        return 0
    prov = provenance.collect(provenance.script_command("engine_speed.py", argv))
    typed = plan_from_args(args)
    given = {k: getattr(typed, k) for k in typed_values(args, Plan.specs())}
    mine = Plan.from_dict({"device": "cuda", **given})
    trainer = Plan.from_dict({**TRAINER_HAND, "seq_len": mine.seq_len})
    launch = {"model": args.model, "given": given}
    earlier = json.loads(args.rows.read_text())["launches"] if args.rows and args.rows.exists() else []

    def save() -> None:  # after each phase: a launch stopped by its time limit keeps what it measured
        if args.rows:
            atomic_write_text(args.rows, json.dumps({"launches": [*earlier, {**launch, "provenance": provenance.finish(prov)}]},
                                                    indent=1) + "\n")

    def search(plan: Plan, engine: str, key: str) -> dict:
        start = 0
        if args.start == "predicted":
            launch[f"{key}_start"] = predicted_start(args.model, args.task, plan, sizes)
            start = launch[f"{key}_start"]["index"]
        launch[key] = largest_batch(args.model, args.task, plan, engine, sizes, Path(scratch), args.timeout, start)
        save()
        return launch[key]

    with tempfile.TemporaryDirectory(prefix="engine-speed-") as scratch:
        sizes = sorted(int(size) for size in args.batch_sizes.split(","))
        fit = search(mine, "trainwise", "trainwise_fit")
        if not args.fit_only and fit["batch_size"]:
            hand = search(trainer, "hf-trainer", "trainer_fit")
            if hand["batch_size"]:
                plans = {"trainer": trainer.replace(batch_size=hand["batch_size"]),
                         "trainwise": mine.replace(batch_size=fit["batch_size"])}
                launch["result"] = summary(timed_runs(args.model, args.task, plans, args.steps, args.repeats,
                                                      Path(scratch), args.timeout), plans)
                save()
    print(json.dumps({k: launch[k] for k in launch if k != "given"}))
    return 0 if fit["batch_size"] and "error" not in launch.get("result", {}) else 1

if __name__ == "__main__":
    sys.exit(main())
