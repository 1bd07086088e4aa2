"""Per-block (regional) torch.compile beside whole-model compile, on this machine's CPU.

For each scope (`--compile-scope blocks`, `--compile-scope model`) and each repeat, two
fresh `trainwise train` processes share one new compile cache: the first compiles cold
(empty cache), the second loads what the first stored (warm). Each reports `compile_s`
(wall seconds of the steps that compiled, measured) and the mean step time of the steps
that did not compile. The model is tiny-llama deepened to --layers blocks (a config
directory written to a temporary folder), so compiling one block versus all of them shows.
The page gives medians, spreads (min-max over the repeats) and the ratios whole/blocks.

    python benchmarks/compile_regions.py [--layers 8] [--repeat 3] [--steps 6]
        [--page docs/results/compile-regions-cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import provenance

provenance.add_repo_to_path()

SCOPES = ("blocks", "model")
CATALOG = provenance.REPO / "trainwise" / "models" / "catalog" / "tiny-llama.json"


def deep_tiny_llama(folder: Path, layers: int) -> Path:
    """tiny-llama's config with `layers` blocks, as a model directory."""
    config = json.loads(CATALOG.read_text())
    config.pop("trainwise", None)
    config["num_hidden_layers"] = layers
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def one_run(model: Path, scope: str, cache: Path, steps: int, work: Path) -> dict:
    """compile_s, compile_steps and the mean uncompiled step time (s) of one fresh process."""
    metrics = work / f"m-{os.getpid()}-{len(list(work.iterdir()))}.jsonl"
    env = {**os.environ, "TRAINWISE_CACHE": str(cache), "PYTHONPATH": str(provenance.REPO)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    command = [sys.executable, "-m", "trainwise", "train", str(model), "--device", "cpu", "--compile",
               "--compile-scope", scope, "--batch-size", "2", "--seq-len", "16", "--steps", str(steps),
               "--data", "synthetic", "--timing-warmup", "0", "--metrics", str(metrics)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{scope}: train failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")
    summary = json.loads(metrics.read_text().splitlines()[-1])["summary"]
    return {"compile_s": summary["compile_s"], "compile_steps": summary["compile_steps"],
            "step_s": summary["step_time_s"]}


def measure(layers: int, repeat: int, steps: int) -> dict:
    """{scope: {"cold": [runs], "warm": [runs]}}, repeats interleaved across scopes so a
    change in the machine's load falls on both."""
    results = {scope: {"cold": [], "warm": []} for scope in SCOPES}
    with tempfile.TemporaryDirectory(prefix="compile-regions-") as tmp:
        root = Path(tmp)
        model = deep_tiny_llama(root / "model", layers)
        work = root / "metrics"
        work.mkdir()
        for index in range(repeat):
            for scope in SCOPES:
                cache = root / f"cache-{scope}-{index}"
                for temperature in ("cold", "warm"):
                    run = one_run(model, scope, cache, steps, work)
                    results[scope][temperature].append(run)
                    print(json.dumps({"scope": scope, "repeat": index, "cache": temperature, **run}), flush=True)
    return results


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def render(results: dict, layers: int, repeat: int) -> str:
    """The page body: one row per scope and cache state, then the ratios of the medians."""
    lines = [f"tiny-llama deepened to {layers} blocks, batch 2 x 16 tokens, fp32, CPU; {repeat} repeat(s), "
             "each a fresh process; median (min-max). `compile_s`: wall seconds of the steps during which "
             "torch.compile ran (measured); step: mean seconds of the other steps (measured).", "",
             "| scope | cache | compile_s | steps that compiled | step (s) |", "| --- | --- | --- | --- | --- |"]
    for scope in SCOPES:
        for temperature in ("cold", "warm"):
            runs = results[scope][temperature]
            lines.append(f"| {scope} | {temperature} | {_stats([r['compile_s'] or 0.0 for r in runs])} | "
                         f"{_stats([r['compile_steps'] for r in runs])} | {_stats([r['step_s'] for r in runs])} |")
    lines += ["", "Ratios of the medians, whole model / per block (above 1: per block is smaller):", ""]
    for temperature in ("cold", "warm"):
        for key, label in (("compile_s", "compile_s"), ("step_s", "step time")):
            medians = [statistics.median([r[key] or 0.0 for r in results[scope][temperature]]) for scope in SCOPES]
            ratio = f"{medians[1] / medians[0]:.2f}" if medians[0] else "n/a"
            lines.append(f"- {label}, {temperature} cache: {ratio}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="transformer blocks of the model")
    parser.add_argument("--repeat", type=int, default=3, help="fresh cold+warm process pairs per scope")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per process")
    parser.add_argument("--page", help="write the results page here (e.g. docs/results/compile-regions-cpu.md)")
    args = parser.parse_args(argv)
    prov = provenance.collect(provenance.script_command("compile_regions.py", sys.argv[1:] if argv is None else argv))
    results = measure(args.layers, args.repeat, args.steps)
    body = render(results, args.layers, args.repeat)
    print(body)
    if args.page:
        from trainwise.common.atomic import atomic_write_text

        atomic_write_text(Path(args.page), provenance.page("Per-block vs whole-model torch.compile on CPU",
                                                           provenance.finish(prov), body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
