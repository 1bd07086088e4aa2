"""Compiled gradients against eager on this CPU, with and without the scatter-add switch.

    python benchmarks/compiled_scatter_add.py                    # small-falcon and tiny-llama, 2 threads
    python benchmarks/compiled_scatter_add.py --models small-falcon,tiny-gpt2 --threads 2
    python benchmarks/compiled_scatter_add.py --runs 20          # also 20 fresh training runs each way

An investigation, not a results page (engine/compile_atomic_add.py says why the switch
exists). For each model and each way (the switch on, as `train --compile` runs; off), a
fresh process builds the model (random weights, seed 0; eval mode, so dropout draws no
different masks in the two steps), runs one forward and backward eagerly and one with its
blocks compiled as `train --compile` compiles them (engine/compile_regions.py), and prints
the largest gradient difference relative to that parameter's largest gradient entry. A
fresh process each: a wrong kernel may corrupt its heap (a crash is reported as such).
With --runs N, N fresh 12-step `trainwise train M --compile` runs each way (batch 8 x 64,
synthetic data, a compile cache of the script's own after the first) count the runs that
end in a crash or a NaN loss. `small-falcon` is the
time-model benchmark's Falcon config (benchmarks/time_model.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import provenance

provenance.add_repo_to_path()

WAYS = ("on", "off")

# The child: one model, one way; prints {"worst": relative difference, "parameter": name}.
GRADIENTS = textwrap.dedent("""
    import copy, json, sys
    import torch
    from trainwise.engine import compile_atomic_add
    from trainwise.engine.compile_regions import compile_model_parts
    from trainwise.models.build import build_model
    from trainwise.models.resolve import resolve_model
    from trainwise.plan.plan import Plan
    model_name, way = sys.argv[1], sys.argv[2]
    if way == "off":
        compile_atomic_add.needs_switch = lambda device_type: False
    torch.manual_seed(0)
    eager = build_model(resolve_model(model_name), device="cpu").eval()
    compiled = copy.deepcopy(eager)
    compile_model_parts([compiled], Plan(device="cpu", compile=True), in_place=False)
    ids = torch.randint(0, min(eager.config.vocab_size, 1000), (4, 64), generator=torch.Generator().manual_seed(1))
    for model in (eager, compiled):
        model(input_ids=ids, labels=ids).loss.backward()
    worst = max(((a.grad - b.grad).abs().max().item() / (a.grad.abs().max().item() or 1.0), name)
                for (name, a), b in zip(eager.named_parameters(), compiled.parameters()) if a.grad is not None)
    print(json.dumps({"worst": worst[0], "parameter": worst[1], "threads": torch.get_num_threads(),
                      "switched": compile_atomic_add.switch_note() is not None}))
""")

# The child of --runs: `trainwise train` with the switch off.
TRAIN_WITHOUT_SWITCH = textwrap.dedent("""
    import sys
    from trainwise.engine import compile_atomic_add
    compile_atomic_add.needs_switch = lambda device_type: False
    from trainwise.cli.main import main
    sys.exit(main())
""")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="small-falcon,tiny-llama",
                        help="comma-separated catalog names, config directories, or small-falcon")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each child (the bug needs 2+)")
    parser.add_argument("--runs", type=int, default=0, help="fresh training runs per way (0: none)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads: must be at least 1, got {args.threads}")
    if args.runs < 0:
        parser.error(f"--runs: must be 0 or more, got {args.runs}")
    return args


def model_path(name: str, scratch: Path) -> str:
    """A catalog name or directory as given; small-falcon written out as a config directory."""
    if name != "small-falcon":
        return name
    from time_model import SMALL_FALCON

    folder = scratch / "small-falcon"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(SMALL_FALCON))
    return str(folder)


def gradients(model: str, way: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", GRADIENTS, model, way], capture_output=True, text=True,
                          timeout=900, env=env)
    if done.returncode != 0:
        return {"error": f"exit code {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def training_runs(model: str, way: str, runs: int, env: dict) -> dict:
    """{"failed": runs that crashed or stopped on a NaN loss, "runs": runs, "errors": [their last lines]}"""
    head = [sys.executable, "-m", "trainwise"] if way == "on" else [sys.executable, "-c", TRAIN_WITHOUT_SWITCH]
    argv = head + ["train", model, "--device", "cpu", "--seq-len", "64", "--batch-size", "8", "--compile",
                   "--data", "synthetic", "--steps", "12", "--seed", "0", "--no-chart"]
    failed, errors = 0, []
    for _ in range(runs):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
        if done.returncode != 0:
            failed += 1
            lines = done.stderr.strip().splitlines()
            errors.append(f"exit code {done.returncode}: {lines[-1] if lines else 'no output'}"[:200])
    return {"failed": failed, "runs": runs, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    print(f"{provenance.device_description()}; commit {provenance.git_commit()}; {provenance.versions()}; "
          f"OMP_NUM_THREADS={args.threads}; load {provenance.load_average()}")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            model = model_path(name, Path(scratch))
            for way in WAYS:
                # Each gradient check compiles afresh; the training runs share a compile cache
                # of their own (each way has its own entries: the switch is part of the key).
                found = gradients(model, way, {**env, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
                if "error" in found:
                    line = f"{name:14s} switch {way:3s}  {found['error']}"
                else:
                    line = (f"{name:14s} switch {way:3s}  largest gradient difference {found['worst']:.2e} of the "
                            f"largest entry ({found['parameter']}); threads {found['threads']}, switched "
                            f"{found['switched']}")
                if args.runs:
                    runs = training_runs(model, way, args.runs, {**env, "TRAINWISE_CACHE": f"{scratch}/cache"})
                    line += f"; training runs failed {runs['failed']} of {runs['runs']}"
                    line += "".join(f"\n    {error}" for error in runs["errors"])
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
