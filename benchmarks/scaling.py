"""Step time and per-rank memory of each parallel layout, on the devices present.

Every layout is one `trainwise train --nproc N` launch (fresh processes, synthetic data),
so one layout's memory never leaks into the next. On a CPU the processes share the
machine's cores (gloo): the step times show each layout's communication and scheduling
cost against one process, not a speed-up. On GPUs each rank has its own device.

    python benchmarks/scaling.py                        # tiny-llama, 2 and 4 CPU processes
    python benchmarks/scaling.py --model tiny-llama --nproc 4 --steps 8 --out scaling-results
    python benchmarks/scaling.py --offload-demo         # one GPU: ZeRO-3 + CPU offload vs plain
    python benchmarks/scaling.py --page docs/results/scaling-cpu.md   # the committed CPU page

The offload demo's defaults (Llama-3.1-8B, bf16-pure, batch 4 x 2048, 3 steps) are sized for
an 80 GB GPU with >= 96 GiB of host memory: the estimate says the plain step peaks at ~106 GiB
allocated, the offloaded one at ~63 GiB plus ~60 GiB of host memory for the offloaded
states (docs/results/offload-H100.md). Pass --model/--batch-size/--seq-len for another GPU.

Writes `results.json` and `results.md` in --out (atomically), and with --page the same
table with its provenance (command, commit, device, versions, machine load) to that file.
Prints one JSON line per layout: status, seconds per step (measured: the median over
--repeats launches of each launch's median timed step, with the spread over the launches),
samples/s and rank 0's measured peak allocated, next to the estimate for rank 0 where it
can be made, and `busy`: what trainwise.common.noise.busy_machine said before the launches
(None: quiet). A layout whose launches spread by more than 10 % or that started on a busy
machine is marked "noisy" in the table: compare its time with care. results.json carries
the provenance too, so a page can be rendered from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import provenance
import torch

provenance.add_repo_to_path()

from trainwise.common.atomic import atomic_write_text  # noqa: E402
from trainwise.common.noise import SPREAD_LIMIT, Spread, busy_machine, spread_text  # noqa: E402
from trainwise.common.units import human_bytes  # noqa: E402

# (name, processes, layout knobs). Processes are capped by --nproc.
LAYOUTS = (
    ("single process", 1, {}),
    ("DDP", 2, {}),
    ("ZeRO-1", 2, {"zero": 1}),
    ("ZeRO-2", 2, {"zero": 2}),
    ("ZeRO-3", 2, {"zero": 3}),
    ("ZeRO-3 + CPU offload", 2, {"zero": 3, "cpu_offload": True}),
    ("TP 2", 2, {"tp": 2}),
    ("TP 2 + sequence parallel", 2, {"tp": 2, "sequence_parallel": True}),
    ("PP 2, 1F1B", 2, {"pp": 2, "pp_schedule": "1f1b"}),
    ("DDP 4", 4, {}),
    ("ZeRO-3 4", 4, {"zero": 3}),
    ("TP 2 x DP 2", 4, {"tp": 2}),
    ("PP 2 x DP 2", 4, {"pp": 2}),
    ("TP 2 x PP 2", 4, {"tp": 2, "pp": 2}),
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: tiny-llama (Llama-3.1-8B with --offload-demo)")
    parser.add_argument("--nproc", type=int, default=None, help="most processes per layout (default: GPUs, or 4)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="micro-batch per data-parallel rank (default 4)")
    parser.add_argument("--seq-len", type=int, default=None, help="default 128 (2048 with --offload-demo)")
    parser.add_argument("--steps", type=int, default=None, help="default 8 (3 with --offload-demo)")
    parser.add_argument("--precision", default=None,
                        help="default: bf16 on a GPU (bf16-pure with --offload-demo), fp32 on a CPU")
    parser.add_argument("--out", default=None,
                        help="directory for results.json and results.md (default: scaling-results, none with --page)")
    parser.add_argument("--offload-demo", action="store_true",
                        help="one GPU: a model too large for plain training, then ZeRO-3 + CPU offload")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--repeats", type=int, default=3, help="launches per layout (median and spread over them)")
    parser.add_argument("--page", type=Path, default=None,
                        help="also write the table with its provenance here (e.g. docs/results/scaling-cpu.md)")
    parser.add_argument("--debug", action="store_true", help="pass --debug to each run (tracebacks in its log)")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count()
    device = "cuda" if gpus else "cpu"
    most = args.nproc or (gpus if gpus else 4)
    demo = args.offload_demo
    # The demo's defaults: a model whose full-parameter bf16 step does not fit an 80 GB GPU
    # but whose offloaded states (bf16 weights, gradients and Adam moments: 8 B/parameter)
    # fit a host with >= 96 GiB; fp32 master weights would need 16 B/parameter there.
    model = args.model or ("Llama-3.1-8B" if demo else "tiny-llama")
    args.batch_size = args.batch_size or 4
    args.seq_len = args.seq_len or (2048 if demo else 128)
    args.steps = args.steps or (3 if demo else 8)
    precision = args.precision or (("bf16-pure" if demo else "bf16") if gpus else "fp32")
    layouts = _offload_demo() if demo else [l for l in LAYOUTS if l[1] <= most]
    prov = provenance.collect(provenance.script_command("scaling.py", argv))
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaling-") as scratch:
        for name, nproc, layout in layouts:
            knobs = {"device": device, "precision": precision, "batch_size": args.batch_size,
                     "seq_len": args.seq_len, **layout}
            row = _repeated(name, nproc, model, knobs, args, Path(scratch))
            row["predicted_peak_allocated_rank0"] = _predicted_peak(model, {**knobs, "nproc": nproc})
            rows.append(row)
            print(json.dumps(row), flush=True)
    prov = provenance.finish(prov)
    title = f"Parallel layouts: {model} on {device}"
    if args.out or not args.page:
        out = Path(args.out or "scaling-results")
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "results.json", json.dumps({"provenance": prov, "rows": rows}, indent=2))
        atomic_write_text(out / "results.md", provenance.page(title, prov, _markdown(rows, args)))
    if args.page:
        atomic_write_text(args.page, provenance.page(title, prov, _markdown(rows, args)))
    return 0


def _repeated(name: str, nproc: int, model: str, knobs: dict, args, scratch: Path) -> dict:
    """`args.repeats` launches of one layout: the median launch's row (by s/step), with
    every launch's s/step under "repeats_seconds_per_step". A failed launch ends the layout."""
    runs, busy = [], []
    for _ in range(max(args.repeats, 1)):
        # A CPU layout's processes share every core; on GPUs each rank drives its GPU from about one.
        busy.append(busy_machine(knobs["device"], needs_cpus=None if knobs["device"] == "cpu" else nproc))
        runs.append(_run(name, nproc, model, knobs, args, scratch))
        if runs[-1]["status"] != "ok":
            break
    timed = sorted((r for r in runs if r.get("seconds_per_step")), key=lambda r: r["seconds_per_step"])
    chosen = timed[(len(timed) - 1) // 2] if timed and runs[-1]["status"] == "ok" else runs[-1]
    times = [r.get("seconds_per_step") for r in runs]
    median = Spread.of(times).median if timed and chosen["status"] == "ok" else None
    return {**chosen, "seconds_per_step": median, "repeats_seconds_per_step": times,
            "busy": next((b for b in busy if b), None)}


def _offload_demo():
    return (("one GPU, plain", 1, {}), ("one GPU, ZeRO-3 + CPU offload", 1, {"zero": 3, "cpu_offload": True}))


def _flags(knobs: dict) -> list[str]:
    """The command-line flags of `knobs`, as the Plan declares them."""
    from trainwise.plan.plan import Plan

    flag_of = {spec.name: spec.flag for spec in Plan.specs()}
    flags = []
    for key, value in knobs.items():
        flags += [flag_of[key]] if value is True else [flag_of[key], str(value)]
    return flags


def _predicted_peak(model: str, knobs: dict) -> int | None:
    """Rank 0's predicted peak allocated for the same plan (None where it cannot be made)."""
    from trainwise.api.estimate import estimate
    from trainwise.models import resolve_model
    from trainwise.common.errors import InputError
    from trainwise.plan.plan import Plan

    try:
        return estimate(resolve_model(model), Plan.from_dict(knobs)).memory.peak_allocated
    except InputError:
        return None


def _run(name: str, nproc: int, model: str, knobs: dict, args, scratch: Path) -> dict:
    metrics = scratch / f"{name.replace(' ', '_')}.jsonl"
    command = [sys.executable, "-m", "trainwise", "train", model, *_flags(knobs), "--nproc", str(nproc),
               "--steps", str(args.steps), "--data", "synthetic", "--metrics", str(metrics)]
    if args.debug:
        command.append("--debug")
    row = {"layout": name, "nproc": nproc, "command": "trainwise " + " ".join(command[3:]).replace(str(metrics), "M")}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**row, "status": "error", "reason": f"timed out after {args.timeout:.0f} s"}
    if args.debug:
        print(done.stderr[-6000:], file=sys.stderr, flush=True)
    if done.returncode != 0:
        status = {2: "skipped", 3: "oom"}.get(done.returncode, "error")
        lines = [l for l in done.stderr.strip().splitlines() if l.strip()]
        return {**row, "status": status, "reason": lines[-1] if lines else f"exit code {done.returncode}"}
    entries = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()]
    steps = [e for e in entries if "summary" not in e]
    summary = next((e["summary"] for e in entries if "summary" in e), {})
    timed = [e["step_time_s"] for e in steps[2:] if e.get("step_time_s")]
    return {**row, "status": "ok", "seconds_per_step": statistics.median(timed) if timed else None,
            "samples_per_s": summary.get("samples_per_s"), "peak_allocated_rank0": summary.get("peak_allocated"),
            "peak_reserved_rank0": summary.get("peak_reserved"), "device_total_rank0": summary.get("device_total"),
            "final_loss": summary.get("final_loss")}


def _markdown(rows: list[dict], args) -> str:
    lines = [f"Micro-batch {args.batch_size} x {args.seq_len} per data-parallel rank, {args.steps} steps, "
             f"synthetic data, each layout launched {args.repeats} time(s) (fresh processes). s/step: each launch's "
             "median over the steps after two warm-up steps, then the median over the launches; spread = "
             "(max - min) / median over the launches; noisy: the spread is over "
             f"{spread_text(SPREAD_LIMIT)} or a launch started on a busy machine (other processes' load beyond "
             "half a CPU), so compare that time with care. samples/s, memory (rank 0's peak allocated) and the "
             "final loss are the median launch's. Predicted is `trainwise estimate` for rank 0.", "",
             "| layout | processes | status | s/step | spread | launches (s/step) | samples/s (job) "
             "| peak allocated rank 0 | predicted | error | final loss |",
             "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        status = r["status"] + (f": {r.get('reason')}" if r["status"] != "ok" else "")
        lines.append("| " + " | ".join([
            r["layout"], str(r["nproc"]), status.replace("|", "/"), _fmt(r.get("seconds_per_step"), ".3f"),
            _spread(r),
            ", ".join(_fmt(s, ".3f") for s in r.get("repeats_seconds_per_step") or []),
            _fmt(r.get("samples_per_s"), ".1f"), _bytes(r.get("peak_allocated_rank0")),
            _bytes(r.get("predicted_peak_allocated_rank0")), _error(r), _fmt(r.get("final_loss"), ".4f")]) + " |")
    busy = [r for r in rows if r.get("busy")]
    lines += ["", f"Machine: busy before {len(busy)} of {len(rows)} layouts ({busy[0]['busy']})." if busy
              else "Machine: quiet before every launch."]
    lines += ["", "Commands (M: the metrics file):", ""] + [f"- {r['layout']}: `{r['command']}`" for r in rows]
    if rows and all(r["nproc"] > 0 for r in rows) and "cpu" in rows[0]["command"]:
        lines += ["", READING_ON_CPU]
    return "\n".join(lines) + "\n"


# What the CPU table can and cannot say, whatever its figures.
READING_ON_CPU = """How to read it on a CPU: the processes share the machine's cores and talk over gloo, so a
parallel layout's step is slower than one process's: the times show each layout's cost in
communication and scheduling on top of the same arithmetic, not a speed-up. Memory is
rank 0's peak allocated from the CPU probe (PyTorch profiler allocation events over the
last step plus the tensors alive at its start), which does not see memory held in C++ from
before the profiled step (DDP's gradient buckets, the pipeline's receive buffers); under
CPU offload "device" and "host" are the same memory, so the measured peak includes the
states the estimate counts as host memory. Rank-0 model states are checked to the byte for
every layout in tests/test_parallel_engine.py."""


def _spread(row: dict) -> str:
    """The launches' spread of s/step, marked noisy over the limit or on a busy machine."""
    spread = Spread.of(row.get("repeats_seconds_per_step") or []).spread
    noisy = row.get("busy") or (spread is not None and spread > SPREAD_LIMIT)
    return spread_text(spread) + (" (noisy)" if noisy else "")


def _error(row: dict) -> str:
    """(predicted - measured) / measured, in %."""
    measured, predicted = row.get("peak_allocated_rank0"), row.get("predicted_peak_allocated_rank0")
    return "n/a" if not measured or predicted is None else f"{(predicted - measured) / measured * 100:+.1f} %"


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _bytes(value) -> str:
    return "n/a" if value is None else human_bytes(value)


if __name__ == "__main__":
    sys.exit(main())
