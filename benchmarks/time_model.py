"""docs/results/time-model-<device>.md: how well the step-time model predicts this machine.

    python benchmarks/time_model.py                     # both cases, calibrating each: ~1.5 h on 2 quiet cores
    python benchmarks/time_model.py --cases default --profile cpu.json  # one case, an existing profile
    python benchmarks/time_model.py --measure-only --page /tmp/t.md   # the measured half alone
    python benchmarks/time_model.py --only vanilla --models tiny-llama   # eager and compiled vanilla rows
    python benchmarks/time_model.py --quick             # a smoke run end to end (a few minutes; no page)

Two cases, in this order (CASES):
1. **default**, the headline: what a user gets. `trainwise calibrate` run as a user runs it
   (a fresh process, torch's default thread count), every plan trained by `trainwise
   train` in a fresh process at the default thread count, a step measured in wall seconds
   (`step_time_s`), what the user waits for.
2. **pinned**: calibration and runs on one thread (OMP_NUM_THREADS=1), a step measured by
   the train process's CPU seconds (`step_cpu_s`: the step's time with a core to itself,
   which other processes on a shared machine do not stretch; wall seconds alongside).

The plans: the quick bench ladder's rows this device runs (fp16 and 8-bit Adam are left
out on a CPU), on the models below at two sequence lengths, and the vanilla plan compiled
per block and whole (`--compile`; the compiling first step falls in the warm-up).
For each plan `trainwise.api.estimate(model, plan, profile=...).time.step_s` is the
prediction; the measurement is `trainwise train` in a fresh process (the bench runner's
command line), the median step time of its timed steps (warm-up steps and the CPU's
memory-profiled last step left out), repeated --repeat times: the median over the
repeats, and their spread (max - min) / median.

Accuracy: MAPE (mean |predicted - measured| / measured) and Spearman's rank correlation
over all plans (nothing here is fitted to these runs), and separately over the
calibration rows (tiny-llama: a time model's constants may be tuned on them) and each
held-out group (SPLITS): models looked at while the time model was changed, models never
seen while fixing, and UNSEEN_FAMILIES, named here before issue 26's fix began and not
looked at while fixing; and the held-out rows once more after a single "step"
correction (median measured/predicted of the calibration rows), as `plan --verify`
would apply one. Targets (issue 16): MAPE <= 15 % and Spearman >= 0.9 over >= 12
plans, judged on the default case; exit 1 when missed, 2 when the time model is not in
this checkout.

The machine's drift: a CPU profile is a minute of the machine's speed, and a shared or
virtual machine's speed comes and goes. Before each round of runs and after the last,
calibrate's own reference steps are timed again in a fresh process (reference_steps.py);
the median of their seconds over the calibration's is the machine's drift. The page shows
it, and all plans once more with every prediction scaled by it (a measured property of the
machine, not fitted on the rows). Where the drift is more than DRIFT_LIMIT the page gives
no verdict and the script exits 3: its errors are the machine's as much as the model's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import provenance

provenance.add_repo_to_path()

from steady_calibration import CALIBRATION_TRIES, calibrate_until_steady  # noqa: E402
from trainwise.common.atomic import atomic_write_text  # noqa: E402

TARGET_MAPE_PCT, TARGET_SPEARMAN, MIN_PLANS = 15.0, 0.9, 12
NOISY_SPREAD = 0.10
# How far the machine's speed during the runs may stray from its speed during calibration
# (calibrate's reference steps timed again between the rounds of runs: reference_steps.py)
# before the page gives no verdict: a profile taken in a fast minute puts one common error
# on every plan, which is the machine's, not the model's. Four fresh calibrations of this
# project's VM left the calibration rows at 0.87-1.26 x their predictions.
DRIFT_LIMIT = 0.10
# A run times enough steps to fill --timed-seconds at the plan's predicted step time: a
# tiny model's step is ~10 ms on 2 cores, and 5 timed steps (50 ms) were one scheduler
# hiccup from a 50-100 % spread between repeats. The cap bounds a run whose prediction is
# far too short.
MAX_TIMED_STEPS = 300
CALIBRATION_MODEL = "tiny-llama"
# A model between tiny-llama (0.2 M parameters) and gpt2 (124 M) that runs a step in a
# fraction of a second on a small CPU: tiny-llama's family and layout, wider and deeper.
SMALL_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048,
               "hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 6,
               "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 2048,
               "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "rope_theta": 10000.0}
# A second held-out model of another family (GPT-2: learned positions, LayerNorm, GELU,
# Conv1D projections as addmm, tied embeddings). Never seen during the first fix; its rows
# (all under-predicted) and a profile of its step were studied for the second (attention's
# and the optimizer's own step factors, checkpointing's host time), so it is no longer clean.
SMALL_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 4096, "n_positions": 512,
              "n_embd": 256, "n_layer": 4, "n_head": 4, "n_inner": None, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-05, "tie_word_embeddings": True}
# The clean held-out set of the second fix: a Qwen2-style decoder (biased q/k/v projections,
# tied embeddings, grouped-query attention, SiLU MLP) of another size, added when that fix
# began and first run once it was final.
SMALL_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 3072,
               "hidden_size": 224, "intermediate_size": 640, "num_hidden_layers": 3, "num_attention_heads": 7,
               "num_key_value_heads": 1, "hidden_act": "silu", "max_position_embeddings": 2048,
               "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "rope_theta": 1000000.0,
               "use_sliding_window": False}
# Families named before issue 26's fix (the default path: threads, wall time, and the op
# kinds the CPU profile missed) began, and not looked at while fixing: an OPT decoder
# (learned positions with an offset, ReLU MLP, dropout), a Falcon decoder (parallel
# attention and MLP, one key-value head, rotary) and the catalog's T5 (encoder-decoder,
# relative position buckets). Their rows are scored apart. T5, Falcon and Qwen2 are no
# longer clean: a study of the compiled rows read their errors, and T5's compiled rows led
# to two fixes (the engine compiled one decoder block's sublayers instead of T5's blocks;
# a compiled region's random numbers got a measured rate of their own). They move to "seen
# during the fix", and a GPT-NeoX decoder (parallel residual, rotary on a quarter of each
# head, LayerNorm, GELU, untied head), named when that fix began and never run before it
# was final, joins OPT as the families not looked at.
SMALL_OPT = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 2560, "hidden_size": 160,
             "ffn_dim": 640, "num_hidden_layers": 3, "num_attention_heads": 5, "max_position_embeddings": 2048,
             "word_embed_proj_dim": 160, "do_layer_norm_before": True, "dropout": 0.1, "attention_dropout": 0.0,
             "activation_function": "relu", "enable_bias": True, "tie_word_embeddings": True, "pad_token_id": 1,
             "bos_token_id": 2, "eos_token_id": 2}
SMALL_FALCON = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "vocab_size": 3584, "hidden_size": 192,
                "num_hidden_layers": 3, "num_attention_heads": 6, "num_kv_heads": 1, "multi_query": True,
                "new_decoder_architecture": False, "parallel_attn": True, "bias": False, "alibi": False,
                "hidden_dropout": 0.0, "attention_dropout": 0.0, "layer_norm_epsilon": 1e-05,
                "max_position_embeddings": 2048, "rope_theta": 10000.0, "tie_word_embeddings": True}
SMALL_NEOX = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 3072,
              "hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 3, "num_attention_heads": 6,
              "hidden_act": "gelu", "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048,
              "use_parallel_residual": True, "layer_norm_eps": 1e-05, "tie_word_embeddings": False,
              "attention_dropout": 0.0, "hidden_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0}
UNSEEN_FAMILIES = ("small-opt", "small-neox")
SEEN_IN_THE_COMPILE_STUDY = ("small-qwen2", "small-falcon", "tiny-t5")
CONFIG_MODELS = {"small-llama": SMALL_LLAMA, "small-gpt2": SMALL_GPT2, "small-qwen2": SMALL_QWEN2,
                 "small-opt": SMALL_OPT, "small-falcon": SMALL_FALCON, "small-neox": SMALL_NEOX}
# Rows added to each model and length besides the quick ladder's: the vanilla plan compiled.
COMPILED_ROWS = (("vanilla compiled", {"compile": True}),
                 ("vanilla compiled whole model", {"compile": True, "compile_scope": "model"}))
# The split each model's rows are scored in.
UNSEEN_SPLIT = "held out, family not looked at in issue 26's fix"
SPLITS = {CALIBRATION_MODEL: "calibration", "small-llama": "held out, seen during the fix",
          "small-gpt2": "held out, seen during the fix",
          **{model: "held out, seen during the fix" for model in SEEN_IN_THE_COMPILE_STUDY},
          **{family: UNSEEN_SPLIT for family in UNSEEN_FAMILIES}}


@dataclass(frozen=True)
class Case:
    """How the plans are calibrated, run and timed: `threads` None is torch's default."""

    name: str
    threads: int | None
    clock: str  # "wall" (step_time_s) or "cpu" (step_cpu_s)
    what: str


# The default path first: the page's headline is what a user gets.
CASES = {"default": Case("default", None, "wall", "default settings: `trainwise calibrate` and every run at torch's "
                                                    "default thread count, a step in wall seconds (what a user waits for)"),
         "pinned": Case("pinned", 1, "cpu", "pinned: calibration and runs on one thread (OMP_NUM_THREADS=1), a step "
                                            "in the train process's CPU seconds (a core to itself)")}
QUICK = {"models": f"{CALIBRATION_MODEL},small-falcon", "seq_lens": "64", "repeat": 1, "steps": 4, "warmup": 1,
         "timed_seconds": 0.0}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, default=None, help="a profile file (default: calibrate now)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3, help="fresh runs per plan (median and spread over them)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    parser.add_argument("--timed-seconds", type=float, default=1.5,
                        help="a run times more steps than --steps gives where the plan's predicted step time "
                             "leaves these seconds unfilled (at most %d timed steps); 0: --steps alone" % MAX_TIMED_STEPS)
    parser.add_argument("--seq-lens", default="64,256")
    parser.add_argument("--models", default=",".join((CALIBRATION_MODEL, "small-llama", "small-gpt2",
                                                      *SEEN_IN_THE_COMPILE_STUDY, *UNSEEN_FAMILIES)))
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"which of {', '.join(CASES)} to run, in that order (see the docstring)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N plans (a smoke run)")
    parser.add_argument("--only", default=None, help="only plans whose name contains one of these comma-separated "
                                                      "parts (e.g. 'compiled,vanilla')")
    parser.add_argument("--measure-only", action="store_true", help="measure without predicting (no time model needed)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: quick calibrations, one repeat, tiny-llama and small-falcon at seq 64, "
                             "the vanilla plan only; printed, no page unless --page, no verdict")
    parser.add_argument("--page", type=Path, default=None, help="default: docs/results/time-model-<device>.md")
    args = parser.parse_args(argv)
    unknown = [name for name in args.cases.split(",") if name not in CASES]
    if unknown:
        parser.error(f"--cases: {', '.join(unknown)} is not a case; choose from {', '.join(CASES)}")
    if args.profile and len(args.cases.split(",")) != 1:
        parser.error("--profile: one profile fits one case (its thread count); name it with --cases default or pinned")
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
        args.only = args.only or "vanilla"
    return args


def plans(args, scratch: Path) -> list[dict]:
    """{name, model (what to pass as MODEL), model_label, plan} for every runnable plan."""
    from trainwise.api.compatibility import check_request
    from trainwise.bench.ladders import load_ladder
    from trainwise.models import resolve_model
    from trainwise.common.errors import InputError
    from trainwise.hardware import resolve_device

    device, found = resolve_device(args.device), []
    for label in args.models.split(","):
        model = label
        if label in CONFIG_MODELS:
            model = str(scratch / label)
            Path(model).mkdir(parents=True, exist_ok=True)
            (Path(model) / "config.json").write_text(json.dumps(CONFIG_MODELS[label]))
        spec = resolve_model(model)
        for seq in (int(s) for s in args.seq_lens.split(",")):
            for rung in load_ladder("quick", {"seq_len": seq, "device": args.device}):
                try:
                    check_request(rung.plan, device, spec, here=True)
                except InputError:
                    # fp16, 8-bit Adam: this device cannot run them; the fused loss: OPT's and T5's
                    # are not checked (the ladder shows them skipped)
                    continue
                found.append({"name": f"{label} s{seq} {rung.name}", "model": model, "model_label": label,
                              "plan": rung.plan,
                              "split": SPLITS.get(label, "held out, never seen while fixing")})
            # Compiled rows: the vanilla plan per block and whole (the first, compiling step is
            # a warm-up step; steps that compiled are never timed by train).
            vanilla = load_ladder("quick", {"seq_len": seq, "device": args.device})[0].plan
            for name, knobs in COMPILED_ROWS:
                found.append({"name": f"{label} s{seq} {name}", "model": model, "model_label": label,
                              "plan": vanilla.replace(**knobs),
                              "split": SPLITS.get(label, "held out, never seen while fixing")})
    found = [row for row in found if not args.only or any(part in row["name"] for part in args.only.split(","))]
    if args.quick:  # the plain vanilla plans: compiling is minutes on a small CPU
        found = [row for row in found if row["name"].endswith(" vanilla")]
    return found[:args.limit] if args.limit else found


def profile_for_run(args, case: Case, scratch: Path):
    """(profile, its file, warnings, calibration tries): the profile predictions use:
    --profile, else `trainwise calibrate` run now in a fresh process under the case's
    settings (the default way: torch's default thread count), again where the machine's
    speed moved while it ran (steady_calibration.py)."""
    from trainwise.api.calibrate import busy_warnings
    from trainwise.hardware.profile import read_profile

    if args.profile:
        profile = read_profile(args.profile)
        return profile, args.profile, busy_warnings(profile.measured), []
    path = scratch / f"profile-{case.name}.json"

    def calibrate_once(attempt: int):
        print(f"calibrating ({case.name}; about a minute; try {attempt} of at most {CALIBRATION_TRIES}) ...",
              flush=True)
        argv = [sys.executable, "-m", "trainwise", "calibrate", "--device", args.device, "--out", str(path)]
        done = subprocess.run(argv + (["--quick"] if args.quick else []), env=case_environment(case),
                              capture_output=True, text=True)
        if done.returncode != 0:
            missing(f"trainwise calibrate failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        profile = read_profile(path)
        return profile, profile.measured, busy_warnings(profile.measured)

    profile, attempts = calibrate_until_steady(calibrate_once)
    return profile, path, attempts[-1]["warnings"], attempts


def case_environment(case: Case) -> dict:
    """The environment of the case's calibration and runs: OMP_NUM_THREADS set for a pinned
    count, else as this script was started (torch's default)."""
    env = dict(os.environ)
    if case.threads:
        env["OMP_NUM_THREADS"] = str(case.threads)
    return env


def predict(rows: list[dict], profile) -> None:
    """Set row["predicted_s"]: the time model's seconds per optimizer step."""
    import inspect

    from trainwise.api import estimate

    if "profile" not in inspect.signature(estimate).parameters:
        missing("trainwise.api.estimate takes no profile= in this checkout: the step-time model is not "
                "in it yet (run with --measure-only for the measured half)")
    for row in rows:
        step = getattr(estimate(row["model"], row["plan"], profile=profile), "time", None)
        if step is None:
            missing(f"the estimate has no .time for {row['name']} with profile {profile.source} "
                    "(the step-time model is missing, or predicted nothing)")
        row["predicted_s"] = step.step_s


def missing(message: str) -> None:
    """Stop with exit code 2: the time model this benchmark measures is not there."""
    print(f"time_model.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def steps_for(predicted_s: float | None, args) -> int:
    """Optimizer steps of one run of a plan: the warm-up, the timed steps (those --steps
    leaves, or more where the predicted step time leaves --timed-seconds unfilled, at most
    MAX_TIMED_STEPS) and, on a CPU, the memory-profiled last one. Without a prediction
    (--measure-only), --steps."""
    untimed = args.warmup + (1 if args.device == "cpu" else 0)
    timed = args.steps - untimed
    seconds = getattr(args, "timed_seconds", 0.0)
    if predicted_s and predicted_s > 0 and seconds > 0:
        timed = max(timed, min(MAX_TIMED_STEPS, math.ceil(seconds / predicted_s)))
    return untimed + timed


def measure_once(row: dict, args, workdir: Path, index: int) -> tuple[float, float] | None:
    """(median CPU seconds, median wall seconds) of the timed steps of one fresh `trainwise
    train` run of row["steps"] steps (default --steps); None on failure."""
    from trainwise.bench.runner import RowJob, command

    slug = "".join(c if c.isalnum() else "-" for c in row["name"])
    plan_file, metrics = workdir / f"{slug}.plan.json", workdir / f"{slug}-{index}.metrics.jsonl"
    plan_file.write_text(json.dumps(row["plan"].to_dict()))
    steps = row.get("steps") or args.steps
    job = RowJob(row["name"], row["plan"], "trainwise", row["model"], steps, args.warmup, 0, None, workdir, 600)
    argv = command(job, plan_file, metrics)
    # Each step's own line is read below (its CPU seconds are not in the summary), so this
    # script logs every step where bench rows log every few (on a CPU a read waits for nothing).
    argv[argv.index("--log-every") + 1] = "1"
    done = subprocess.run(argv, capture_output=True, text=True, timeout=job.timeout_s, env=case_environment(args.case))
    if done.returncode != 0 or not metrics.is_file():
        row.setdefault("errors", []).append((done.stderr.strip().splitlines() or ["no output"])[-1])
        return None
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.startswith('{"step"')]
    # Timed: after the warm-up, and not the CPU's last step (run under the memory profiler).
    last = len(steps) if args.device != "cpu" else len(steps) - 1
    timed = [s for s in steps[args.warmup:last] if s.get("step_time_s")]
    if not timed:
        return None
    return statistics.median(s.get("step_cpu_s") or 0.0 for s in timed), statistics.median(s["step_time_s"] for s in timed)


def measure(rows: list[dict], args, workdir: Path, between=None) -> None:
    """Set row["measured_s"] (median over repeats) and row["spread"]. Repeats go round the
    plans, so a slow spell of a shared machine hits several plans once, not one plan thrice.
    `between()`, if given, runs before each round and after the last."""
    for row in rows:
        row["repeats_s"], row["repeats_wall_s"] = [], []
        row["steps"] = steps_for(row.get("predicted_s"), args)
    for index in range(args.repeat):
        if between:
            between()
        for row in rows:
            found = measure_once(row, args, workdir, index)
            if found is not None:
                row["repeats_s"].append(found[0] if args.clock == "cpu" else found[1])
                row["repeats_wall_s"].append(found[1])
        print(f"repeat {index + 1} of {args.repeat} done", flush=True)
    if between:
        between()
    for row in rows:
        times = row["repeats_s"]
        row["measured_s"] = statistics.median(times) if times else None
        row["wall_s"] = statistics.median(row["repeats_wall_s"]) if times else None
        row["spread"] = (max(times) - min(times)) / row["measured_s"] if len(times) > 1 else None


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            result[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return result


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else None


def accuracy(pairs: list[tuple[float, float]]) -> dict:
    """{"n", "mape_pct", "spearman"} of (predicted, measured) pairs."""
    if not pairs:
        return {"n": 0, "mape_pct": None, "spearman": None}
    mape = 100 * statistics.fmean(abs(p - m) / m for p, m in pairs)
    return {"n": len(pairs), "mape_pct": mape, "spearman": spearman([p for p, _ in pairs], [m for _, m in pairs])}


def reference_prober(args, profile, profile_path: Path | None, probes: list[dict]):
    """A function that times calibrate's reference steps again in a fresh process under the
    case's environment (reference_steps.py, given `profile_path`, the file `profile` was
    read from) and appends what it found to `probes`; None when `profile` timed no
    reference steps (a GPU's)."""
    from reference_steps import calibrated_steps

    if profile is None or not calibrated_steps(profile.measured or {}):
        return None
    script = Path(__file__).resolve().with_name("reference_steps.py")

    def probe():
        done = subprocess.run([sys.executable, str(script), "--profile", str(profile_path)], capture_output=True,
                              text=True, timeout=600, env=case_environment(args.case))
        if done.returncode != 0:
            probes.append({"error": (done.stderr.strip().splitlines() or ["no output"])[-1]})
        else:
            probes.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return probe


def drift(probes: list[dict]) -> dict | None:
    """{"ratio" (median over the probes of each one's seconds now / at calibration),
    "low", "high", "probes" (those that ran)}; None without a probe that ran."""
    ran = [p for p in probes if p.get("ratio")]
    if not ran:
        return None
    ratios = [p["ratio"] for p in ran]
    return {"ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios), "probes": ran}


def summarize(rows: list[dict], machine_drift: dict | None = None) -> dict:
    """Accuracy over all plans, the calibration rows, the held-out rows (all of them, and
    each held-out split apart: "groups"), and the held-out rows after a "step" correction
    fitted on the calibration rows; with the machine's drift since calibration measured
    (`drift`), all plans once more with every prediction scaled by it."""
    scored = [r for r in rows if r.get("measured_s") and r.get("predicted_s")]
    calibration = [r for r in scored if r["split"] == "calibration"]
    held_out = [r for r in scored if r["split"].startswith("held out")]
    pairs = lambda subset, k=1.0: [(k * r["predicted_s"], r["measured_s"]) for r in subset]  # noqa: E731
    correction = statistics.median(r["measured_s"] / r["predicted_s"] for r in calibration) if calibration else None
    return {"calibration_model": CALIBRATION_MODEL, "all": accuracy(pairs(scored)), "calibration": accuracy(pairs(calibration)),
            "held_out": accuracy(pairs(held_out)), "correction": correction,
            "held_out_corrected": accuracy(pairs(held_out, correction)) if correction else accuracy([]),
            "groups": {split: accuracy(pairs([r for r in scored if r["split"] == split]))
                       for split in dict.fromkeys(r["split"] for r in scored) if split != "calibration"},
            "wall": accuracy([(r["predicted_s"], r["wall_s"]) for r in scored if r.get("wall_s")]),
            "drift": machine_drift,
            "drift_scaled": accuracy(pairs(scored, machine_drift["ratio"])) if machine_drift else accuracy([])}


def verdict(summary: dict) -> tuple[bool | None, str]:
    """(met, the page's line): None, no verdict, when the machine's speed during the runs
    strayed more than DRIFT_LIMIT from its speed during calibration."""
    machine = summary.get("drift")
    if machine and abs(machine["ratio"] - 1) > DRIFT_LIMIT:
        return None, (f"NO VERDICT: the machine ran calibrate's reference steps {machine['ratio']:.2f} x as long "
                      f"during the runs as during the calibration (more than {100 * DRIFT_LIMIT:.0f} % apart), so "
                      "every error below carries the machine's drift as well as the model's; calibrate and run "
                      "again on a steadier machine")
    everything = summary["all"]
    ok = (everything["n"] >= MIN_PLANS and everything["mape_pct"] is not None
          and everything["mape_pct"] <= TARGET_MAPE_PCT and (everything["spearman"] or 0) >= TARGET_SPEARMAN)
    return ok, (f"{'met' if ok else 'MISSED'}: MAPE <= {TARGET_MAPE_PCT:.0f} % and Spearman >= "
                f"{TARGET_SPEARMAN} over >= {MIN_PLANS} plans (all plans, no correction)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import torch

    args.default_threads = torch.get_num_threads()  # the default case's, read before any case sets one
    page = args.page or (None if args.measure_only or args.quick else
                         provenance.REPO / "docs" / "results" / f"time-model-{args.device.replace(':', '')}.md")
    prov, started = provenance.collect(provenance.script_command("time_model.py", argv)), time.perf_counter()
    sections, verdicts = [], []
    with tempfile.TemporaryDirectory(prefix="time-model-") as scratch:
        rows_of_models = plans(args, Path(scratch))
        for name in args.cases.split(","):
            text, ok = run_case(args, CASES[name], [dict(row) for row in rows_of_models], Path(scratch))
            sections.append(text)
            verdicts.append(ok)
    prov = provenance.finish(prov)
    text = "\n".join(sections) + f"\nWhole benchmark: {(time.perf_counter() - started) / 60:.1f} min.\n"
    print(text)
    if page:
        atomic_write_text(page, provenance.page(f"Step-time model accuracy on {args.device}", prov, text))
        print(f"wrote {page}")
    # Judged on the first case, the default path when it runs; 3: no verdict (the machine drifted).
    return {True: 0, False: 1, None: 3}[verdicts[0]]


def run_case(args, case: Case, rows: list[dict], scratch: Path) -> tuple[str, bool]:
    """The page's section for one case and whether it met the targets: calibrate (or read
    --profile), predict in this process at the case's thread count, measure in fresh
    processes under the case's environment."""
    import torch

    from render_time_model import render

    args = argparse.Namespace(**vars(args), case=case, threads=case.threads, clock=case.clock)
    torch.set_num_threads(case.threads or args.default_threads)  # the thread count estimate checks the profile against
    case_prov = {"load_start": provenance.load_average(), "cores": provenance.cpu_count(),
                 "cpu_probe": provenance.cpu_probe()}
    profile, profile_path, warnings, tries = ((None, None, [], []) if args.measure_only
                                              else profile_for_run(args, case, scratch))
    if profile is not None:
        predict(rows, profile)  # first: a missing time model fails in seconds, not after the runs
    started, probes = time.perf_counter(), []
    measure(rows, args, scratch, between=reference_prober(args, profile, profile_path, probes))
    warnings += noise_warnings(rows, provenance.finish(case_prov))
    warnings += [f"calibrate's reference steps could not be timed again: {p['error']}" for p in probes if p.get("error")]
    summary = summarize(rows, drift(probes))
    if args.quick:
        ok, line = True, "quick smoke run: too few plans and repeats for a verdict"
    else:
        ok, line = verdict(summary) if profile is not None else (True, "measured only: no prediction, no verdict")
    return render(rows, summary, line, warnings, args, profile, time.perf_counter() - started, tries), ok


def noise_warnings(rows: list[dict], prov: dict) -> list[str]:
    warnings = [f"{r['name']}: repeats spread {100 * r['spread']:.0f} % (> {100 * NOISY_SPREAD:.0f} %)"
                for r in rows if r.get("spread") is not None and r["spread"] > NOISY_SPREAD]
    if provenance.busy(prov):
        warnings.insert(0, f"the machine was busy ({provenance.load_line(prov)})")
    failed = [f"{r['name']}: {r['errors'][-1]}" for r in rows if r.get("errors")]
    return warnings + [f"run failed: {f}" for f in failed]


if __name__ == "__main__":
    sys.exit(main())
