"""docs/results/vs-hf-trainer-<device>.md from the rows file that launches of
benchmarks/vs_hf_trainer.py --rows FILE append to (one launch per case, each with its
runs and provenance; a launch cut short keeps its finished runs and shows no ratio).

    python benchmarks/vs_hf_trainer.py --repeats 3 --steps 30 --rows docs/results/rows/vs-hf-trainer-cpu.json
    python benchmarks/render_vs_trainer.py docs/results/rows/vs-hf-trainer-cpu.json \
        --out docs/results/vs-hf-trainer-cpu.md

A later launch of the same case and plan replaces an earlier one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import provenance

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path, help="the rows file of vs_hf_trainer.py --rows")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    launches = provenance.read_launches([args.rows], "render_vs_trainer.py", "vs_hf_trainer.py")
    if launches is None:
        return 2
    provenance.write_page(args.out, render_page(latest(launches), provenance.script_command("render_vs_trainer.py", argv)))
    return 0


def latest(launches: list[dict]) -> list[dict]:
    """One launch per (case, model, plan, steps): the last one."""
    kept: dict[str, dict] = {}
    for launch in launches:
        key = json.dumps([launch["case"], launch["model"], launch["plan"], launch["steps"]], sort_keys=True)
        kept[key] = launch
    return list(kept.values())


def render_page(launches: list[dict], command: str) -> str:
    first = launches[0]["provenance"]
    prov = provenance.of_launches(launches, command, lambda l: f"`{l['provenance']['command']}`; machine load: "
                                                                f"{provenance.load_line(l['provenance'])}")
    device = "GPU" if first["device"].startswith("GPU") else "CPU"
    lines = ["Each run is a fresh process; runs alternate (trainwise, Trainer, Trainer, trainwise, ...). samples/s "
             "leave out the warm-up steps (and, on a CPU, the memory-profiled step); the figure is the median over "
             "the runs, spread = (max - min) / median, each run listed. Ratios are trainwise / Trainer: "
             "samples_per_s_ratio > 1 means trainwise is faster, peak_memory_ratio < 1 that it needs less. "
             "The headline ratio is paired: the i-th run of each engine ran next to each other, and the figure is "
             "the median over the pairs of the two runs' ratio (each pair listed), shown when the pairs spread by "
             "at most 10 %; a machine whose speed moves between minutes spreads each engine's runs, not a pair. "
             "The ratio of the two medians is beside it (launches before the pairing have only that one)."
             + (" On a CPU, trainwise's runs keep the memory a step frees (glibc told not to unmap or trim it: "
                "trainwise/hardware/allocator.py, from commit 0ad8b1f on) and the Trainer's process runs glibc's "
                "default, which faults a step's freed buffers in afresh; launches before that commit ran both "
                "under the default." if device == "CPU" else ""), "",
             "| launch | case | plan | steps | samples/s trainwise | runs | spread | samples/s Trainer | runs | spread "
             "| samples/s ratio, paired (measured) | pairs | samples_per_s_ratio of medians | peak allocated trainwise "
             "| peak_memory_ratio | MFU trainwise / Trainer |",
             "|---:|---|---|---:|---:|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|"]
    for number, launch in enumerate(launches, 1):
        result = launch.get("result") or {}
        cells = [str(number), launch["case"], ", ".join(f"{k}={v}" for k, v in launch["plan"].items()),
                 str(launch["steps"])]
        for engine in ("trainwise", "hf-trainer"):
            cells += _speed_cells([r for r in launch["runs"] if r["engine"] == engine])
        mfu = result.get("mfu") or {}
        withheld = result.get("ratio_withheld")
        cells += _paired_cells(result)
        cells += [f"not shown: {withheld}".replace("|", "/") if withheld else _num(result.get("samples_per_s_ratio"), ".3f"),
                  _gib((result.get("peak_allocated_bytes") or {}).get("trainwise")),
                  _num(result.get("peak_memory_ratio"), ".3f"),
                  f"{_pct(mfu.get('trainwise'))} / {_pct(mfu.get('hf-trainer'))}"]
        lines.append("| " + " | ".join(cells) + " |")
    unfinished = [n for n, l in enumerate(launches, 1) if not l.get("result")]
    if unfinished:
        lines += ["", f"No ratio for launch {', '.join(map(str, unfinished))}: a run failed or the launch was cut "
                      "before its last run (its finished runs are listed)."]
    return provenance.page(f"trainwise vs the `transformers` Trainer, {device}", prov, "\n".join(lines))


def _paired_cells(result: dict) -> list[str]:
    """The paired ratio (or why it is withheld) and each pair's ratio; "n/a" for a launch
    measured before the pairing (or one without a result)."""
    if "samples_per_s_ratio_paired" not in result:
        return ["n/a", "n/a"]
    withheld = result.get("paired_withheld")
    shown = (f"not shown: {withheld}".replace("|", "/") if withheld
             else _num(result["samples_per_s_ratio_paired"], ".3f"))
    return [shown, " ".join(f"{r:.3f}" for r in result.get("paired_ratios") or []) or "none"]


def _speed_cells(runs: list[dict]) -> list[str]:
    speeds = [r["samples_per_s"] for r in runs if r.get("status") == "ok" and r.get("samples_per_s")]
    if not speeds:
        return ["n/a", ", ".join(r["status"] for r in runs) or "none", "n/a"]
    median = statistics.median(speeds)
    spread = f"{(max(speeds) - min(speeds)) / median * 100:.0f} %" if len(speeds) > 1 else "n/a"
    shown = ", ".join(f"{r['samples_per_s']:.1f}" if r.get("samples_per_s") else r["status"] for r in runs)
    return [f"{median:.1f}", shown, spread]


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _gib(value) -> str:
    provenance.add_repo_to_path()
    from trainwise.common.units import human_bytes

    return "n/a" if value is None else human_bytes(value)


def _pct(value) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


if __name__ == "__main__":
    sys.exit(main())
