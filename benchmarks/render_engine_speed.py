"""docs/results/engine-speed-<gpu>.md from the rows files that launches of
benchmarks/engine_speed.py --rows FILE write (stage `engine-speed` of gpu_validation.sh):
trainwise's fastest plan against the Trainer's hand configuration, each at its largest
micro-batch, measured side by side on one GPU.

    python benchmarks/render_engine_speed.py docs/results/rows/engine-speed-H200-*.json \
        --out docs/results/engine-speed-H200.md

Launches merge in the order given; a later launch of the same model and plan replaces an
earlier one. A launch cut short before its timed runs shows its batch search only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import provenance

GIB = 2**30


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path, nargs="+", help="rows files of engine_speed.py --rows")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    launches = provenance.read_launches(args.rows, "render_engine_speed.py", "engine_speed.py")
    if launches is None:
        return 2
    provenance.write_page(args.out, render_page(latest(launches),
                                                provenance.script_command("render_engine_speed.py", argv)))
    return 0


def latest(launches: list[dict]) -> list[dict]:
    """One launch per (model, given knobs, fit-only): the last one given."""
    kept: dict[str, dict] = {}
    for launch in launches:
        key = json.dumps([launch["model"], launch["given"], "result" not in launch and "trainer_fit" not in launch],
                         sort_keys=True)
        kept[key] = launch
    return list(kept.values())


def render_page(launches: list[dict], command: str) -> str:
    prov = provenance.of_launches(launches, command, lambda l: f"`{l['provenance']['command']}`; machine load: "
                                                                f"{provenance.load_line(l['provenance'])}")
    lines = ["Each side runs its own plan at the largest micro-batch its short runs finished with (the "
             "search's tries are listed below; `--start predicted` starts at the largest size the estimate says "
             "fits). The Trainer's side is a careful user's hand configuration: bf16 mixed precision, fused "
             "AdamW, SDPA attention, no checkpointing. Then each side ran in fresh processes, alternating "
             "(trainwise, Trainer, Trainer, trainwise, ...); figures are the medians of those runs, warm-up "
             "steps left out. tokens/s counts real tokens (samples/s x sequence length) on the one GPU. MFU is "
             "the model's FLOPs per second over the catalog's dense bf16 peak of the GPU, also for plans whose "
             "matmuls run in float8 (their own peak is twice that). Peak memory is PyTorch's "
             "`max_memory_allocated`. All figures measured.", ""]
    lines += ["| model | side | plan | micro-batch | tokens/s (measured) | MFU (measured) | "
              "peak allocated GiB (measured) | runs |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for launch in launches:
        lines += _rows(launch)
    lines += ["", "| model | trainwise / Trainer tokens/s | trainwise / Trainer peak memory |", "| --- | ---: | ---: |"]
    for launch in launches:
        result = launch.get("result") or {}
        if "tokens_per_s_ratio" in result:
            lines.append(f"| {launch['model']} | {result['tokens_per_s_ratio']:.2f}x | "
                         f"{result['peak_memory_ratio']:.2f}x |")
        else:
            lines.append(f"| {launch['model']} | not measured ({result.get('error', 'the launch ended before its timed runs')}) | - |")
    lines += ["", "## Batch search", ""]
    for launch in launches:
        for key, side in (("trainwise_fit", "trainwise"), ("trainer_fit", "Trainer")):
            if key in launch:
                tried = ", ".join(f"{batch}: {status}" for batch, status, _ in launch[key]["tried"])
                lines.append(f"- {launch['model']}, {side}: tried {tried}; largest that ran: "
                             f"{launch[key]['batch_size']}{_capped(launch, key)}")
    return provenance.page("trainwise's fastest plan vs the Trainer's hand configuration", prov, "\n".join(lines))


def _rows(launch: dict) -> list[str]:
    sides = (launch.get("result") or {}).get("sides", {})
    out = []
    for side, label in (("trainwise", "trainwise"), ("trainer", "Trainer")):
        if side not in sides:
            continue
        got = sides[side]
        plan = dict(got["plan"])
        batch = plan.pop("batch_size", "-")
        plan.pop("seq_len", None)
        knobs = ", ".join(f"{k}={v}" for k, v in plan.items())
        seq = launch["given"].get("seq_len")
        mfu = f"{got['mfu'] * 100:.1f} %" if got.get("mfu") is not None else "-"
        runs = _spread(got.get("runs", []))
        out.append(f"| {launch['model']} (seq {seq}) | {label} | {knobs} | {batch} | {got['tokens_per_s']:,.0f} | "
                   f"{mfu} | {got['peak_allocated_bytes'] / GIB:.1f} | {runs} |")
    return out


def _spread(runs: list[float]) -> str:
    """How many runs, and their spread (max - min) / median; older rows kept medians only."""
    if not runs:
        return "medians only"
    ordered = sorted(runs)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    return f"{len(runs)}, spread {(ordered[-1] - ordered[0]) / median * 100:.1f} %"


def _capped(launch: dict, key: str) -> str:
    """Says so when the largest size tried ran: the search walks up while runs finish, so it
    stopped for want of sizes, and a larger batch may fit."""
    tried = launch[key]["tried"]
    largest = max(tried, key=lambda entry: entry[0])
    return " (the largest size offered to the search: a larger one may fit)" if largest[1] == "ok" else ""

if __name__ == "__main__":
    sys.exit(main())
