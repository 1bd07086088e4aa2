"""trainwise against the `transformers` Trainer: same model, data, knobs and step count.

Each engine trains in its own fresh process (as `trainwise bench` runs its rows), and the
runs alternate A B B A ... so slow drift of a shared machine hits both engines alike. Before
each run the machine's load is checked (trainwise.common.noise.busy_machine).

The headline speed ratio is paired: the i-th run of each engine are neighbours in time (A B,
then B A, ...), and `samples_per_s_ratio_paired` is the median over i of trainwise's
samples/s over the Trainer's in that pair. A machine whose speed moves by a third over
tens of seconds with nothing else running (this project's 2-core VM: docs/plan.md,
*Provenance and noise*) spreads each engine's runs far past 10 %, so a ratio of the two
medians compares runs taken minutes apart; a pair's two runs share their minute. It is
given when the pairs' ratios spread by at most 10 % and the machine was never busy, else
it is null and `paired_withheld` says why. The ratio of the medians stays beside it
(`samples_per_s_ratio`, withheld past a 10 % spread of either engine, `ratio_withheld`):

    python benchmarks/vs_hf_trainer.py                       # the case sized for this machine
    python benchmarks/vs_hf_trainer.py --case bert-large     # a named case (GPU)
    python benchmarks/vs_hf_trainer.py tiny-llama --batch-size 8 --seq-len 256 --steps 30

With --rows FILE the launch's result, its runs and its provenance (command, commit,
device, versions, machine load) are appended to FILE (JSON), from which
benchmarks/render_vs_trainer.py renders docs/results/vs-hf-trainer-<device>.md.

Prints one JSON line per run (with `busy`: what the machine was doing when it started) and
a last line with `samples_per_s_ratio_paired` and `paired_ratios` (trainwise / Trainer, > 1
means trainwise is faster), `samples_per_s_ratio`, each engine's median, min, max and
spread, and `peak_memory_ratio` (trainwise / Trainer peak allocated, < 1 means trainwise
needs less). Exits 1 when trainwise is slower than the Trainer (paired ratio < 1.0), when
the paired ratio was withheld (it could not be measured here), or
when trainwise needs more memory (ratio > 1.01: "equal memory" allows 1 %, a few tens of KiB
on the CPU case, where both engines hold the same tensors).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import provenance
import torch
import transformers

provenance.add_repo_to_path()

from trainwise.bench.runner import RowJob, run_row
from trainwise.cli.flags import add_knob_flags, plan_from_args, typed_values  # noqa: E402
from trainwise.common.atomic import atomic_write_text  # noqa: E402
from trainwise.common.noise import SPREAD_LIMIT, Ratio, Spread, busy_machine, confident_ratio, spread_text  # noqa: E402
from trainwise.plan.plan import Plan  # noqa: E402

# Named cases: (model, knobs). The GPU ones are the issue's: bert-large-uncased at seq 512
# (the classic single-GPU example) and a ~1B Llama-style decoder in bf16.
CASES = {
    "cpu": ("tiny-llama", {"batch_size": 8, "seq_len": 256, "device": "cpu"}),
    "bert-large": ("bert-large-uncased", {"batch_size": 8, "seq_len": 512, "precision": "bf16", "device": "cuda",
                                          "optim": "adamw-fused"}),
    "llama-1b": ("Llama-3.2-1B", {"batch_size": 4, "seq_len": 2048, "precision": "bf16", "device": "cuda",
                                  "optim": "adamw-fused", "grad_ckpt": True}),
}
ENGINES = ("trainwise", "hf-trainer")
EQUAL_MEMORY = 1.01


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="catalog model (default: the case's)")
    parser.add_argument("--case", choices=sorted(CASES), default=None,
                        help="named case (default: cpu without a GPU, bert-large with one)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="steps per run left out of the timing")
    parser.add_argument("--repeats", type=int, default=3, help="runs per engine (alternated)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--rows", type=Path, default=None, help="append this launch's result to this JSON file")
    add_knob_flags(parser)
    args = parser.parse_args(argv)
    prov = provenance.collect(provenance.script_command("vs_hf_trainer.py", argv))
    case = args.case or ("bert-large" if torch.cuda.is_available() else "cpu")
    model, case_knobs = CASES[case]
    typed = plan_from_args(args)  # validates the typed flags
    plan = Plan.from_dict({**case_knobs, **{k: getattr(typed, k) for k in typed_values(args, Plan.specs())}})
    model = args.model or model

    runs: dict[str, list[dict]] = {engine: [] for engine in ENGINES}
    launch = {"case": case, "model": model, "plan": plan.changed_knobs(), "steps": args.steps, "runs": []}
    busy = []  # what busy_machine() said before each run
    earlier = _launches(args.rows) if args.rows else []
    with tempfile.TemporaryDirectory(prefix="vs-hf-trainer-") as scratch:
        for engine in _alternating(args.repeats):
            job = RowJob(engine, plan, engine, model, args.steps, args.warmup, 0, None,
                         Path(scratch), args.timeout)
            busy.append(busy_machine(plan.device, needs_cpus=None if plan.device == "cpu" else 1))
            row = run_row(job)
            runs[engine].append(row)
            line = {"engine": engine, "status": row["status"], "reason": row.get("reason"), "busy": busy[-1],
                    "samples_per_s": row.get("samples_per_s"), "mfu": row.get("mfu"),
                    "peak_allocated": row["measured"].get("peak_allocated"), "step_times_s": row.get("step_times_s")}
            print(json.dumps(line), flush=True)
            launch["runs"].append(line)
            if args.rows:  # after every run: a launch cut by a time limit keeps its runs
                _save_launch(args.rows, earlier, {**launch, "provenance": provenance.finish(prov)})
    failed = [r for rows in runs.values() for r in rows if r["status"] != "ok"]
    if failed:
        print(json.dumps({"error": f"{failed[0]['engine']}: {failed[0]['status']}: {failed[0].get('reason')}"}))
        return 1
    prov = provenance.finish(prov)
    spreads = {e: Spread.of(r["samples_per_s"] for r in runs[e]) for e in ENGINES}
    speed = {e: spreads[e].median for e in ENGINES}
    busy_reason = next((b for b in busy if b), None)
    ratio = confident_ratio(spreads["trainwise"], spreads["hf-trainer"], busy=busy_reason)
    paired, pairs = paired_ratio(runs["trainwise"], runs["hf-trainer"], busy=busy_reason)
    memory = {e: statistics.median(r["measured"]["peak_allocated"] for r in runs[e]) for e in ENGINES}
    mfu = {e: _median_or_none([r.get("mfu") for r in runs[e]]) for e in ENGINES}
    result = {
        "case": case, "model": model, "plan": plan.changed_knobs(), "steps": args.steps, "repeats": args.repeats,
        "samples_per_s_ratio_paired": paired.to_json()["ratio"], "paired_withheld": paired.withheld,
        "paired_ratios": [round(r, 4) for r in pairs],
        "samples_per_s_ratio": ratio.to_json()["ratio"], "ratio_withheld": ratio.withheld,
        "samples_per_s_spread": {e: spreads[e].to_json() for e in ENGINES},
        "busy": [b for b in busy if b],
        "peak_memory_ratio": round(memory["trainwise"] / memory["hf-trainer"], 3),
        "samples_per_s": speed, "peak_allocated_bytes": memory, "mfu": mfu,
        "measured_with": "fresh-process runs, the i-th of each engine neighbours in time (paired), and their "
                         "medians; samples/s leave out warm-up steps",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "device": torch.cuda.get_device_name(0) if plan.device != "cpu" and torch.cuda.is_available()
        else platform.processor() or "cpu",
    }
    print(json.dumps(result))
    if args.rows:
        _save_launch(args.rows, earlier, {**launch, "provenance": prov, "result": result})
    faster = result["samples_per_s_ratio_paired"] is not None and result["samples_per_s_ratio_paired"] >= 1.0
    return 0 if faster and result["peak_memory_ratio"] <= EQUAL_MEMORY else 1


def paired_ratio(trainwise_runs: list[dict], trainer_runs: list[dict], busy: str | None = None):
    """(Ratio, [ratio of each pair]): the median over i of the i-th trainwise run's
    samples/s over the i-th Trainer run's (neighbours in time: `_alternating`), a pair with
    a failed run left out; withheld when `busy`, with fewer than two pairs, or when the
    pairs' ratios spread by more than SPREAD_LIMIT."""
    pairs = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(trainwise_runs, trainer_runs)
             if a.get("samples_per_s") and b.get("samples_per_s")]
    spread = Spread.of(pairs)
    if busy:
        return Ratio(None, busy), pairs
    if spread.n < 2:
        return Ratio(None, "fewer than two pairs: no spread to judge it by"), pairs
    if spread.spread > SPREAD_LIMIT:
        return Ratio(None, f"the pairs' ratios spread {100 * spread.spread:.1f} % > {spread_text(SPREAD_LIMIT)}"), pairs
    return Ratio(spread.median), pairs


def _launches(path: Path) -> list[dict]:
    """The launches already in a rows file (none when it does not exist yet)."""
    return json.loads(path.read_text())["launches"] if path.exists() else []


def _save_launch(path: Path, earlier: list[dict], launch: dict) -> None:
    """The rows file: the launches that were there, then this one as it stands."""
    atomic_write_text(path, json.dumps({"launches": [*earlier, launch]}, indent=1) + "\n")


def _alternating(repeats: int) -> list[str]:
    """A B B A A B ...: each engine runs as often first as second."""
    order = []
    for index in range(repeats):
        order += list(ENGINES if index % 2 == 0 else reversed(ENGINES))
    return order


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


if __name__ == "__main__":
    sys.exit(main())
