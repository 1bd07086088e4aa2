"""docs/results/planner-regret-cpu.md: how much the planner's pick loses against the fastest
plan it kept, measured, on this CPU at the settings a user has.

    python benchmarks/planner_regret.py                    # ~20-25 min on a quiet 2-core machine
    python benchmarks/planner_regret.py --quick --rows /tmp/r.json --page /tmp/r.md   # a smoke run, ~5 min
    python benchmarks/planner_regret.py --groups tiny-bert/s64/gb4,tiny-t5/s64/gb4

The user's default path: `trainwise calibrate` (default threads, written to the per-user
profile cache), then `trainwise plan MODEL --device cpu --seq-len S --global-batch B`. This
script does the same in a fresh cache directory ($TRAINWISE_CACHE set to a new temporary
folder, so no profile of an earlier run or another user is found): it calibrates there
(`--profile FILE` copies a given profile there instead), then runs the search through
`trainwise.api.plan_search` with no profile named, so the search finds the calibrated
profile as `trainwise plan` would. The planner's prediction of each plan is the one it
ranked by: the exact estimate for the confirmed top (--top, as `plan --top K` shows), the
composed one for the rest.

Per group (model x sequence length x global batch): the pick and the other confirmed plans,
and --random plans drawn with a fixed seed from the rest of the kept plans that fit, each
run by `trainwise train` in a fresh process at default threads (the bench runner's command
line), wall seconds per step (the median of its timed steps), --repeats times, the repeats
going round all plans of all groups so that a slow spell of the machine hits every plan
alike. Then, per group, --settle more runs each of the two plans the decision turns on (the
pick and the fastest other plan measured), taken alternately: the runs of one process spread
by up to half on this 2-core machine, for the Hugging Face Trainer as for trainwise, so a
regret read from 3 runs each can be all noise. Every group gets them, whichever of the two
was ahead, so the extra runs cannot only ever help the pick. Measured = the median over all
runs; spread = (max - min) / median.

Per group: the pick's regret, read two ways from the same runs. Paired (the headline): the
rival is the fastest other plan by median; each round of runs holds one run of each (the
round-robin rounds, a minute or so apart, and the settling pairs, back to back), and the
regret is the median over the rounds of pick / rival, less 1, or 0 where that is under 1.
A slow spell then stretches both runs of a pair, not one plan's median: on this VM the
machine's speed moves within the hour by more than the plans differ. Of medians (as
before): measured(pick) / measured(fastest measured) - 1, shown beside both plans' spreads
(a regret under them is inside the noise). Also per group: Spearman's rank correlation of
predicted and measured times; the pairs the model misorders. Overall: the median and
maximum regret, the median Spearman. Targets (issue 26): median regret <= 3 %, max <= 10 %,
within-group Spearman >= 0.8, judged on the paired regret where every group has pairs.
Nothing is fitted here. Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import provenance

provenance.add_repo_to_path()

from steady_calibration import CALIBRATION_TRIES, calibrate_until_steady, tries_text  # noqa: E402
from trainwise.common.atomic import atomic_write_text  # noqa: E402

# The groups: tiny catalog models (built from their configs, nothing downloaded), small
# enough that one step is a fraction of a second on 2 cores, so 8 groups of 7 plans with 3
# repeats fit the run-time budget. Five families, chosen for what they make the time
# model price differently: a decoder with RMSNorm, SiLU and grouped-query attention
# (llama), a decoder with LayerNorm, GELU and Conv1D projections (gpt2), an encoder with a
# classification head (bert: no causal mask, no LM-sized logits), an encoder-decoder
# (t5: cross-attention, relative position bias, two stacks) and a mixture of experts
# (mixtral: routing, small expert matmuls). Two lengths per dense decoder and encoder
# family, where attention's share moves. Global batches of 4 samples at 64 tokens and 2 at
# 256: the fitting micro-batches then include accumulation (the planner chooses between
# them), and the slowest plan of a group (micro-batch 1, accumulated, checkpointed) still
# runs a step in a second or two.
GROUPS = (
    {"model": "tiny-llama", "seq_len": 64, "global_batch": 4},
    {"model": "tiny-llama", "seq_len": 256, "global_batch": 2},
    {"model": "tiny-gpt2", "seq_len": 64, "global_batch": 4},
    {"model": "tiny-gpt2", "seq_len": 256, "global_batch": 2},
    {"model": "tiny-bert", "seq_len": 64, "global_batch": 4},
    {"model": "tiny-bert", "seq_len": 256, "global_batch": 2},
    {"model": "tiny-t5", "seq_len": 64, "global_batch": 4},
    {"model": "tiny-mixtral", "seq_len": 64, "global_batch": 4},
)
# Per group the confirmed top 5 and 2 drawn from the rest, 3 repeats, at least 5 steps (the
# first a warm-up, the last memory-profiled) and 1.5 s of timed steps, then 4 settling runs
# each of two plans: 232 runs of 5-15 s each on a quiet 2-core machine (a process start of
# 3-4 s, the model, the steps), with the calibration and the searches about 35 min.
# --quick: one decoder and the encoder-decoder, a few plans, two repeats (a smoke run).
QUICK_GROUPS = ("tiny-llama/s64/gb4", "tiny-t5/s64/gb4")
TARGET_MEDIAN_REGRET, TARGET_MAX_REGRET, TARGET_SPEARMAN = 0.03, 0.10, 0.8


def group_name(group: dict) -> str:
    return f"{group['model']}/s{group['seq_len']}/gb{group['global_batch']}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default=None, help="comma-separated group names (default: all): "
                                                       + ", ".join(group_name(g) for g in GROUPS))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 groups, top 2 + 1 drawn, 2 repeats, "
                                                              "4 steps, a quick calibration")
    parser.add_argument("--top", type=int, default=5, help="confirmed plans measured per group (the pick first)")
    parser.add_argument("--random", type=int, default=2, help="plans drawn from the other kept plans that fit")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    parser.add_argument("--repeats", type=int, default=3, help="fresh runs per plan")
    parser.add_argument("--settle", type=int, default=4,
                        help="more runs each of the pick and the fastest other plan per group, alternately, "
                             "after the round-robin repeats (0: none)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of each run")
    parser.add_argument("--timed-seconds", type=float, default=1.5,
                        help="a run times more steps than --steps gives where the plan's predicted step time leaves "
                             "these seconds unfilled (time_model.steps_for); 0: --steps alone")
    parser.add_argument("--profile", type=Path, default=None,
                        help="a profile file to use instead of calibrating (copied into the fresh cache)")
    parser.add_argument("--rows", type=Path, default=provenance.REPO / "docs/results/rows/planner-regret-cpu.json")
    parser.add_argument("--page", type=Path, default=provenance.REPO / "docs/results/planner-regret-cpu.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups = args.groups or ",".join(QUICK_GROUPS)
        args.top, args.random, args.repeats, args.steps = min(args.top, 2), min(args.random, 1), 2, 4
        args.settle = min(args.settle, 1)
        args.timed_seconds = 0.0
    for name in ("top", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be 1 or more (got {getattr(args, name)})")
    if args.settle < 0:
        parser.error(f"--settle must be 0 or more (got {args.settle})")
    if args.random < 0 or args.warmup < 1 or args.steps < args.warmup + 2:
        parser.error("--random must be 0 or more, --warmup 1 or more, and --steps at least --warmup + 2 "
                     "(a timed step, and the last step, which is memory-profiled on a CPU and not timed)")
    args.chosen = chosen_groups(parser, args.groups)
    if args.profile is not None and not args.profile.is_file():
        parser.error(f"--profile {args.profile}: not a file (write one with trainwise calibrate --out FILE)")
    return args


def chosen_groups(parser: argparse.ArgumentParser, text: str | None) -> list[dict]:
    """The groups --groups names (all by default); an unknown name is refused naming the closest."""
    from trainwise.common.suggest import closest

    by_name = {group_name(g): g for g in GROUPS}
    if text is None:
        return list(GROUPS)
    chosen = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name not in by_name:
            near = closest(name, by_name)
            parser.error(f"--groups: no group {name!r}" + (f"; did you mean {near}?" if near else "")
                         + f" (groups: {', '.join(by_name)})")
        chosen.append(by_name[name])
    return chosen


def profile_in_fresh_cache(args, cache: Path) -> dict:
    """Calibrate into (or copy --profile into) the fresh cache's default profile path; how.
    A calibration during which the machine's speed moved is run again (steady_calibration.py):
    the page's picks rest on the profile."""
    from trainwise.api.calibrate import calibrate
    from trainwise.hardware import resolve_device
    from trainwise.hardware.profile import default_profile_path

    path = default_profile_path(resolve_device("cpu"))
    if args.profile is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.profile, path)
        return {"how": f"the profile given (--profile {args.profile}), copied into a fresh cache", "warnings": [],
                "calibration_s": None}

    def calibrate_once(attempt: int):
        print(f"calibrating the CPU in a fresh cache (default threads; try {attempt} of at most "
              f"{CALIBRATION_TRIES}) ...", flush=True)
        result = calibrate("cpu", quick=args.quick)
        return result, result.profile.measured, result.warnings

    _result, attempts = calibrate_until_steady(calibrate_once)
    return {"how": f"`trainwise calibrate --device cpu{' --quick' if args.quick else ''}` run first in a fresh "
                   "cache directory, at default threads; the search found it where `trainwise plan` looks"
                   + tries_text(attempts),
            "warnings": attempts[-1]["warnings"], "calibration_s": attempts[-1]["calibration_s"],
            "attempts": attempts}


def plans_of_group(group: dict, args) -> dict:
    """The search's pick and the plans to measure, each with the prediction it was ranked by."""
    from trainwise.api.search import plan_search
    from trainwise.plan.plan import Plan

    started = time.perf_counter()
    report = plan_search(group["model"], Plan(device="cpu", seq_len=group["seq_len"]), {"device", "seq_len"},
                         global_batch=group["global_batch"], top=args.top)
    result = report.result
    confirmed = list(result.ranked)
    seen = {c.plan for c in confirmed}
    rest = sorted({c.plan: c for c in result.screened if c.plan not in seen and c.memory_bytes <= result.usable_bytes
                   }.values(), key=lambda c: -c.tokens_per_s)
    drawn = random.Random(f"{args.seed}/{group_name(group)}").sample(rest, min(args.random, len(rest)))
    plans = [plan_row(c, "pick" if i == 0 else "confirmed") for i, c in enumerate(confirmed)]
    plans += [plan_row(c, "drawn") for c in drawn]
    return {"name": group_name(group), **group, "kept_fitting": len(confirmed) + len(rest),
            "search_s": round(time.perf_counter() - started, 1), "plans": plans}


def plan_row(candidate, role: str) -> dict:
    plan = candidate.plan
    shown = {k: v for k, v in plan.changed_knobs().items() if k not in ("device", "seq_len")}
    return {"role": role, "plan": plan.to_dict(), "label": " ".join(f"{k}={v}" for k, v in shown.items()),
            "predicted_s": candidate.step_s, "exact": candidate.exact, "changes_math": list(candidate.changes_math),
            "notes": [n for n in candidate.notes if n.startswith("tied with")], "repeats_s": [], "errors": []}


def startup_seconds() -> float:
    """Wall seconds of a fresh process importing what a train run imports (torch,
    transformers, the engine): most of every run's cost that is not its steps."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import trainwise.api.training"], capture_output=True, check=False)
    return time.perf_counter() - started


def estimate_minutes(groups: list[dict], args, startup_s: float) -> float:
    """The measuring's predicted wall time: per run a start, then every step (the timed ones,
    the warm-up and the memory-profiled last one, counted as 3 steps) at its predicted time."""
    from time_model import steps_for

    per_repeat = sum(startup_s + (steps_for(p["predicted_s"], _runner(args)) + 2) * p["predicted_s"]
                     for g in groups for p in g["plans"])
    settling = sum(2 * args.settle * (startup_s + (steps_for(p["predicted_s"], _runner(args)) + 2) * p["predicted_s"])
                   for g in groups for p in g["plans"][:1])
    return (per_repeat * args.repeats + settling) / 60


def measure(groups: list[dict], args, workdir: Path) -> None:
    """Each plan's repeats, round-robin over all plans of all groups."""
    from time_model import measure_once, steps_for
    from trainwise.plan.plan import Plan

    runner = _runner(args)
    rows = [(g, p) for g in groups for p in g["plans"]]
    for _group, plan in rows:
        plan["steps"] = steps_for(plan["predicted_s"], runner)
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for number, (group, plan) in enumerate(rows):
            row = {"name": f"{group['name']} {number}", "model": group["model"], "plan": Plan.from_dict(plan["plan"]),
                   "steps": plan["steps"]}
            found = measure_once(row, runner, workdir, repeat)
            if found is None:
                plan["errors"].append((row.get("errors") or ["no timed step"])[-1])
            else:
                plan["repeats_s"].append(found[1])  # wall seconds: what a user waits for
                plan.setdefault("rounds", []).append(repeat)  # which runs of two plans pair up
        spent = time.perf_counter() - started
        print(f"repeat {repeat + 1} of {args.repeats} done after {spent / 60:.1f} min; about "
              f"{spent / (repeat + 1) * (args.repeats - repeat - 1) / 60:.1f} min left (measured)", flush=True)


def contenders(group: dict) -> tuple[int, int] | None:
    """(index of the pick, index of the fastest other plan measured) in group["plans"]: the
    two plans whose order decides the pick's regret; None when fewer than two have runs."""
    timed = [(statistics.median(p["repeats_s"]), i) for i, p in enumerate(group["plans"]) if p["repeats_s"]]
    pick = next((i for i, p in enumerate(group["plans"]) if p["role"] == "pick" and p["repeats_s"]), None)
    others = sorted(t for t in timed if t[1] != pick)
    if pick is None or not others:
        return None
    return pick, others[0][1]


def settle(groups: list[dict], args, workdir: Path) -> None:
    """--settle more runs each of every group's pick and fastest other plan, alternately (so
    a slow spell hits both alike), added to their repeats."""
    from time_model import measure_once
    from trainwise.plan.plan import Plan

    if not args.settle:
        return
    runner, started = _runner(args), time.perf_counter()
    for group in groups:
        pair = contenders(group)
        if pair is None:
            continue
        for repeat in range(args.settle):
            # Each pair's two runs back to back, the order swapped every pair (pick first,
            # then rival first, ...): whatever the second run of a pair gains or loses from
            # the first falls on both plans alike.
            for index in (pair if repeat % 2 == 0 else pair[::-1]):
                plan = group["plans"][index]
                plan["settle_runs"] = plan.get("settle_runs", 0) + 1
                row = {"name": f"{group['name']} {index}", "model": group["model"],
                       "plan": Plan.from_dict(plan["plan"]), "steps": plan["steps"]}
                found = measure_once(row, runner, workdir, args.repeats + repeat)
                if found is None:
                    plan["errors"].append((row.get("errors") or ["no timed step"])[-1])
                else:
                    plan["repeats_s"].append(found[1])
                    plan.setdefault("rounds", []).append(args.repeats + repeat)
        print(f"{group['name']}: settled plans {pair[0] + 1} and {pair[1] + 1} with {args.settle} more runs each "
              f"({(time.perf_counter() - started) / 60:.1f} min of settling so far, measured)", flush=True)


def _runner(args) -> argparse.Namespace:
    """time_model's run settings for these runs: its default case (torch's default thread
    count, as the user's `trainwise train`), this script's step counts."""
    from time_model import CASES

    return argparse.Namespace(steps=args.steps, warmup=args.warmup, device="cpu", case=CASES["default"],
                              timed_seconds=getattr(args, "timed_seconds", 0.0))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from render_planner_regret import render_page, summarize

    runs = len(args.chosen) * (args.top + args.random) * args.repeats
    print(f"{len(args.chosen)} groups, up to {args.top + args.random} plans each, {args.repeats} repeats: up to "
          f"{runs} fresh train runs, after a calibration and {len(args.chosen)} searches; the measuring time is "
          "estimated from the planner's predictions once the plans are known", flush=True)
    prov, started = provenance.collect(provenance.script_command("planner_regret.py", argv)), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="planner-regret-") as scratch:
        os.environ["TRAINWISE_CACHE"] = str(Path(scratch) / "cache")  # the train runs inherit it
        profile = profile_in_fresh_cache(args, Path(scratch))
        groups = []
        for group in args.chosen:
            groups.append(plans_of_group(group, args))
            print(f"{groups[-1]['name']}: searched in {groups[-1]['search_s']:.0f} s, {len(groups[-1]['plans'])} "
                  f"plans to measure of {groups[-1]['kept_fitting']} kept that fit", flush=True)
        startup = startup_seconds()
        print(f"estimate: measuring takes about {estimate_minutes(groups, args, startup):.1f} min (predicted step "
              f"times; {startup:.1f} s per process start, measured now)", flush=True)
        measure(groups, args, Path(scratch))
        settle(groups, args, Path(scratch))
    launch = {"provenance": provenance.finish(prov), "device_kind": "cpu", "profile": profile,
              "settings": {k: getattr(args, k) for k in ("top", "random", "seed", "repeats", "settle", "steps",
                                                         "warmup", "timed_seconds")},
              "minutes": round((time.perf_counter() - started) / 60, 1), "groups": groups}
    atomic_write_text(args.rows, json.dumps({"launches": [launch]}, indent=1) + "\n")
    print(f"wrote {args.rows}")
    command = provenance.script_command("render_planner_regret.py", [_shown(args.rows), "--out", _shown(args.page)])
    provenance.write_page(args.page, render_page([launch], command))
    return 0 if summarize(groups)["met"] else 1


def _shown(path: Path) -> str:
    """A path inside the checkout as the page's command names it (relative), else as given."""
    try:
        return str(path.resolve().relative_to(provenance.REPO))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
