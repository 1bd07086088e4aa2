"""How long `trainwise.api.estimate` takes, in-process, on this machine's CPU.

Prints one JSON line for the import, one for the warm-up call (a tiny model: it pays for
the lazy imports of transformers' model code) and one per case, each with the seconds
taken (median and spread over --repeat calls), the machine's CPU count and its 1-minute
load average at the start (the last line also at the end). Last, what a user waits for:
the command line from a cold start (`trainwise estimate bert-large-uncased ...` in a fresh
process, Python start, torch and transformers imports included), next to the in-process
figure: first with an empty trace cache (a temporary one per run: the headline), then
with the cache a previous process filled (the same request again; no torch or transformers import,
no trace), and a process that only imports what the cold run cannot do without (transformers'
BERT code, the fake tensors: the floor under the first figure). The in-process cases do not use the trace cache. Targets on 2 cores: bert-large-uncased batch 4 x 512 under 5 s, Llama-3.1-70B
batch 1 x 4096 bf16 under 30 s.

    python benchmarks/estimate_speed.py [--repeat N] [--device A100-80GB]

Exits 1 when a case misses its target.
"""

from __future__ import annotations

import time

_IMPORT_STARTED = time.perf_counter()
import trainwise.api.estimate  # noqa: E402  (timed: torch, transformers and the estimate path; trainwise.api alone is lazy)

IMPORT_S = time.perf_counter() - _IMPORT_STARTED

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

from trainwise.plan.plan import Plan  # noqa: E402

CASES = (
    # (name, model, knobs, target seconds on 2 cores)
    ("bert-large b4 s512", "bert-large-uncased", {"batch_size": 4, "seq_len": 512}, 5.0),
    ("llama-70b b1 s4096 bf16", "Llama-3.1-70B", {"batch_size": 1, "seq_len": 4096, "precision": "bf16"}, 30.0),
    ("llama-70b b1 s4096 bf16 ckpt", "Llama-3.1-70B",
     {"batch_size": 1, "seq_len": 4096, "precision": "bf16", "grad_ckpt": True}, 30.0),
)


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def timed_estimate(model: str, knobs: dict, device: str) -> tuple[float, object]:
    plan = Plan.from_dict({**knobs, "device": device})
    started = time.perf_counter()
    result = trainwise.api.estimate(model, plan)
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per case (median reported)")
    parser.add_argument("--device", default="A100-80GB", help="target device of the estimates")
    args = parser.parse_args(argv)
    # The 1-minute load average at the start: above the CPU count, other work shared the machine.
    common = {"cpus": cpu_count(), "torch_threads": _torch_threads(), "python": sys.version.split()[0],
              "load_at_start": _load()}
    print(json.dumps({"case": "import trainwise.api.estimate", "seconds": round(IMPORT_S, 3), **common}), flush=True)
    warm_s, _ = timed_estimate("tiny-llama", {"batch_size": 2, "seq_len": 64}, args.device)
    print(json.dumps({"case": "warm-up (tiny-llama)", "seconds": round(warm_s, 3), **common}), flush=True)
    all_met = True
    for name, model, knobs, target in CASES:
        runs = []
        for _ in range(max(args.repeat, 1)):
            seconds, result = timed_estimate(model, knobs, args.device)
            runs.append(seconds)
        median = statistics.median(runs)
        met = median < target
        all_met &= met
        print(json.dumps({
            "case": name, "model": model, "plan": {**knobs, "device": args.device},
            "seconds": round(median, 3), "runs": [round(r, 3) for r in runs],
            "spread_pct": round((max(runs) - min(runs)) / median * 100, 1), "target_s": target,
            "meets_target": met, "traced_blocks": result.traced_blocks, "total_blocks": result.total_blocks,
            "peak_allocated_gib": round(result.memory.peak_allocated / 1024**3, 2), **common,
        }), flush=True)
    line = "trainwise estimate bert-large-uncased --batch-size 4 --seq-len 512"
    first, repeated = _cold_cli_seconds(args.device, args.repeat)
    floor, heavy = _import_floor(args.repeat)
    print(json.dumps({"case": f"cold CLI, first run (empty trace cache): {line}",
                      "seconds": round(statistics.median(first), 3), "runs": [round(r, 3) for r in first],
                      "includes": "Python start-up, torch and transformers imports, BERT model code import, the traces",
                      **common}), flush=True)
    print(json.dumps({"case": f"the floor under the first run: a process that only imports {FLOOR_IMPORT}",
                      "seconds": round(statistics.median(floor), 3), "runs": [round(r, 3) for r in floor],
                      "includes": "Python start-up, torch, transformers and BERT's model code with what it imports "
                                  f"(of {', '.join(HEAVY)}: {', '.join(heavy) or 'none'}), the fake tensors",
                      **common}), flush=True)
    print(json.dumps({"case": f"cold CLI, repeated (trace cache filled by a previous process): {line}",
                      "seconds": round(statistics.median(repeated), 3), "runs": [round(r, 3) for r in repeated],
                      "includes": "Python start-up, the cached figures priced; no torch, no transformers, no trace",
                      **common, "load_at_end": _load()}), flush=True)
    return 0 if all_met else 1


def _cold_cli_seconds(device: str, repeat: int) -> tuple[list[float], list[float]]:
    """Seconds of the command in fresh processes: each first run with a trace cache of its
    own, empty (what a user's first estimate of a request takes), then runs whose cache a
    previous process filled (the same request again)."""
    import tempfile

    command = [sys.executable, "-m", "trainwise", "estimate", "bert-large-uncased", "--batch-size", "4",
               "--seq-len", "512", "--device", device, "--json"]

    def timed(cache: str) -> float:
        return _timed_process(command, {"TRAINWISE_CACHE": cache})[0]

    first = []
    for _ in range(max(repeat, 1)):
        with tempfile.TemporaryDirectory(prefix="trainwise-estimate-speed-") as cache:
            first.append(timed(cache))
    with tempfile.TemporaryDirectory(prefix="trainwise-estimate-speed-") as cache:
        timed(cache)  # fills it
        repeated = [timed(cache) for _ in range(max(repeat, 1))]
    return first, repeated


# What a cold estimate of bert-large-uncased must import before it can build and trace the
# model: transformers' BERT code (which imports the rest) and the fake tensors; and the
# modules of the libraries' own choosing whose presence the floor's line reports.
FLOOR_IMPORT = "transformers.models.bert.modeling_bert, torch._subclasses.fake_tensor"
HEAVY = ("torch._dynamo", "torch.distributed.tensor", "sympy", "accelerate")


def _import_floor(repeat: int) -> tuple[list[float], list[str]]:
    """Seconds of fresh processes that import only FLOOR_IMPORT (the part of the cold
    command's time that is the libraries' own), and which of HEAVY they imported."""
    code = f"import sys, {FLOOR_IMPORT}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    runs = [_timed_process([sys.executable, "-c", code]) for _ in range(max(repeat, 1))]
    return [seconds for seconds, _ in runs], runs[-1][1].strip().split(",")


def _timed_process(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Seconds a fresh process took, and its stdout."""
    import subprocess

    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True, env={**os.environ, **(env or {})})
    return time.perf_counter() - started, done.stdout


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
