"""docs/results/planner-regret-cpu.md from the rows file benchmarks/planner_regret.py writes
(docs/results/rows/planner-regret-cpu.json): the planner's pick against the fastest plan
measured, per group, and over all groups.

    python benchmarks/render_planner_regret.py docs/results/rows/planner-regret-cpu.json \
        --out docs/results/planner-regret-cpu.md

The page shows the last launch of the files given.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import provenance

provenance.add_repo_to_path()

from planner_regret import TARGET_MAX_REGRET, TARGET_MEDIAN_REGRET, TARGET_SPEARMAN  # noqa: E402
from steady_calibration import tries_lines  # noqa: E402
from time_model import spearman  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path, nargs="+", help="rows files of planner_regret.py")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    launches = provenance.read_launches(args.rows, "render_planner_regret.py", "planner_regret.py")
    if launches is None:
        return 2
    provenance.write_page(args.out, render_page(launches[-1:], provenance.script_command("render_planner_regret.py",
                                                                                         argv)))
    return 0


def measured(plan: dict) -> tuple[float | None, float | None]:
    """(median wall seconds over the repeats, spread (max - min) / median or None for one run)."""
    times = plan["repeats_s"]
    if not times:
        return None, None
    median = statistics.median(times)
    return median, (max(times) - min(times)) / median if len(times) > 1 else None


def paired_ratios(pick: dict, rival: dict) -> list[float]:
    """pick / rival seconds of each round of runs both plans have a run in (the plans'
    `rounds`, parallel to their `repeats_s`); none for rows written without rounds."""
    rival_by_round = dict(zip(rival.get("rounds", []), rival["repeats_s"]))
    return [seconds / rival_by_round[r] for r, seconds in zip(pick.get("rounds", []), pick["repeats_s"])
            if r in rival_by_round]


def group_summary(group: dict) -> dict:
    """The pick's regret (paired, and of medians) beside the noise, Spearman, and the
    misordered pairs (1-based numbers of the group's plans, the one predicted faster first)."""
    plans = [(n, p, *measured(p)) for n, p in enumerate(group["plans"], 1)]
    timed = [(n, p, m, s) for n, p, m, s in plans if m is not None]
    pick = next(((n, p, m, s) for n, p, m, s in timed if p["role"] == "pick"), None)
    if pick is None or len(timed) < 2:
        return {"regret": None, "noise": None, "spearman": None, "misordered": [], "best": None,
                "paired_regret": None, "pairs": [], "rival": None}
    best = min(timed, key=lambda row: row[2])
    rival = min((row for row in timed if row[0] != pick[0]), key=lambda row: row[2])
    ratios = paired_ratios(pick[1], rival[1])
    misordered = []
    for a in timed:
        for b in timed:
            if a[1]["predicted_s"] < b[1]["predicted_s"] and a[2] > b[2]:
                gap = a[2] / b[2] - 1
                misordered.append({"faster_predicted": a[0], "faster_measured": b[0], "gap": gap,
                                   "beyond_noise": gap > max(a[3] or 0, b[3] or 0)})
    return {"regret": pick[2] / best[2] - 1, "noise": max(pick[3] or 0, best[3] or 0), "best": best[0],
            "paired_regret": max(0.0, statistics.median(ratios) - 1) if ratios else None, "pairs": ratios,
            "rival": rival[0],
            "spearman": spearman([p["predicted_s"] for _, p, _, _ in timed], [m for _, _, m, _ in timed]),
            "misordered": sorted(misordered, key=lambda x: -x["gap"])}


def summarize(groups: list[dict]) -> dict:
    """Over all groups; the targets are judged on the paired regret where every group has
    pairs (rows written before runs were paired: on the regret of medians)."""
    per = {g["name"]: group_summary(g) for g in groups}
    regrets = [s["regret"] for s in per.values() if s["regret"] is not None]
    paired = [s["paired_regret"] for s in per.values() if s["paired_regret"] is not None]
    rhos = [s["spearman"] for s in per.values() if s["spearman"] is not None]
    overall = {"median_regret": statistics.median(regrets) if regrets else None, "max_regret": max(regrets, default=None),
               "median_paired_regret": statistics.median(paired) if paired else None,
               "max_paired_regret": max(paired, default=None),
               "median_spearman": statistics.median(rhos) if rhos else None}
    judged_paired = bool(paired) and len(paired) == len(groups)
    judged = paired if judged_paired else regrets
    median, largest = (statistics.median(judged), max(judged)) if judged else (None, None)
    met = (bool(judged) and len(judged) == len(groups) and median <= TARGET_MEDIAN_REGRET
           and largest <= TARGET_MAX_REGRET and overall["median_spearman"] is not None
           and overall["median_spearman"] >= TARGET_SPEARMAN)
    return {"groups": per, **overall, "judged_paired": judged_paired, "met": met}


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def render_page(launches: list[dict], command: str) -> str:
    launch = launches[-1]
    prov = {**launch["provenance"], "command": command,
            "extra": {"measured by": f"`{launch['provenance']['command']}`",
                      "device profile": launch["profile"]["how"]}}
    groups, settings = launch["groups"], launch["settings"]
    summary = summarize(groups)
    lines = [f"What the planner's pick loses against the fastest plan measured, on this CPU at a user's settings: "
             f"the device profile as `trainwise calibrate` makes it ({launch['profile']['how']}), the search of "
             "`trainwise plan MODEL --device cpu --seq-len S --global-batch B` (`trainwise.api.plan_search`, "
             f"--top {settings['top']}), then per group the pick, the other confirmed plans and {settings['random']} "
             f"drawn (seed {settings['seed']}) from the other kept plans that fit, each run by `trainwise train` in a "
             f"fresh process at default threads: {_steps_text(settings)}, the first {settings['warmup']} and the "
             "memory-profiled last one untimed, wall seconds per step (median of the timed steps), "
             f"{settings['repeats']} runs per plan taken round-robin over all plans{_settle_text(settings)}. "
             "Measured = the median over all runs; spread = (max - min) / median. Predicted: the figure the planner ranked by (exact estimate "
             "for confirmed plans, composed for drawn ones). Paired regret (the headline): the median, over the "
             "rounds in which both ran, of the pick's seconds over its rival's (the fastest other plan by median), "
             "less 1 (0 where under 1); the pairs column gives each round's ratio, and a regret is beyond the noise "
             "only where every pair has the pick slower. Regret of medians = measured(pick) / measured(fastest) - 1; "
             "one under the larger spread of the two plans is inside the noise. Whole benchmark: "
             f"{launch['minutes']} min.", ""]
    targets = (f"median regret <= {TARGET_MEDIAN_REGRET * 100:.0f} %, max regret <= {TARGET_MAX_REGRET * 100:.0f} "
               f"%, median within-group Spearman >= {TARGET_SPEARMAN}")
    rho = f"{summary['median_spearman']:.2f}" if summary["median_spearman"] is not None else "-"
    if summary["judged_paired"]:
        measured_text = (f"paired regret median {_pct(summary['median_paired_regret'])}, max "
                         f"{_pct(summary['max_paired_regret'])}; median Spearman {rho}; the regret of medians: median "
                         f"{_pct(summary['median_regret'])}, max {_pct(summary['max_regret'])}")
    else:
        measured_text = (f"median regret {_pct(summary['median_regret'])}, max {_pct(summary['max_regret'])} (of "
                         f"medians: these rows have no paired runs), median Spearman {rho}")
    lines += [f"**{'met' if summary['met'] else 'MISSED'}: {targets}** (measured: {measured_text})", ""]
    warnings = _warnings(launch)
    if warnings:
        lines += ["Warnings (the figures below may be off):", ""] + [f"- {w}" for w in warnings] + [""]
    lines += tries_lines(launch["profile"].get("attempts", []))
    lines += ["| group | pick | rival (fastest other) | paired regret (measured) | pairs: pick / rival per round | "
              "fastest measured | regret of medians (measured) | noise: larger spread of the two | "
              "Spearman (predicted vs measured) | misordered pairs beyond noise / all |",
              "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for group in groups:
        found = summary["groups"][group["name"]]
        pick = group["plans"][0]["label"] or "defaults"
        beyond = sum(m["beyond_noise"] for m in found["misordered"])
        rho = f"{found['spearman']:.2f}" if found["spearman"] is not None else "-"
        inside = " (inside the noise)" if found["regret"] is not None and found["regret"] <= found["noise"] else ""
        lines.append(f"| {group['name']} | 1: {pick} | {found['rival'] or '-'} | {_paired(found)} | "
                     f"{' '.join(f'{r:.2f}' for r in found['pairs']) or '-'} | {found['best'] or '-'} | "
                     f"{_pct(found['regret'])}{inside} | {_pct(found['noise'])} | {rho} | {beyond} / "
                     f"{len(found['misordered'])} |")
    for group in groups:
        lines += _group_section(group, summary["groups"][group["name"]])
    return provenance.page("Planner regret on cpu", prov, "\n".join(lines))


def _paired(found: dict) -> str:
    """The paired regret, and whether every pair had the pick slower (beyond the noise)."""
    if found["paired_regret"] is None:
        return "-"
    if found["paired_regret"] == 0:
        return "0.0 %"
    every = all(r > 1 for r in found["pairs"])
    return f"{_pct(found['paired_regret'])}" + ("" if every else " (inside the noise)")


def _settle_text(settings: dict) -> str:
    """The settling runs after the round-robin, where the launch made them."""
    if not settings.get("settle"):
        return ""
    return (f", then {settings['settle']} more runs each of the pick and the fastest other plan of each group, "
            "in pairs of back-to-back runs, the order swapped every pair (the runs column counts them)")


def _steps_text(settings: dict) -> str:
    """How many steps a run takes: --steps, or more to fill --timed-seconds of timed steps."""
    seconds = settings.get("timed_seconds") or 0.0
    if not seconds:
        return f"{settings['steps']} steps"
    return (f"at least {settings['steps']} steps, more where the plan's predicted step time leaves under "
            f"{seconds:g} s of timed steps (the steps per run column)")


def _group_section(group: dict, found: dict) -> list[str]:
    lines = ["", f"## {group['name']}", "",
             f"{len(group['plans'])} plans measured of {group['kept_fitting']} kept that fit; search "
             f"{group['search_s']} s (measured).", "",
             "| # | role | plan (knobs off their defaults) | predicted s/step (predicted) | measured s/step (median, "
             "measured) | spread | runs | steps per run |", "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for number, plan in enumerate(group["plans"], 1):
        median, spread = measured(plan)
        kind = "exact" if plan["exact"] else "composed"
        runs = f"{len(plan['repeats_s'])}" + (f", failed: {plan['errors'][-1]}" if plan["errors"] else "")
        lines.append(f"| {number} | {plan['role']} | {plan['label'] or 'defaults'} | {_seconds(plan['predicted_s'])} "
                     f"({kind}) | {_seconds(median)} | {_pct(spread)} | {runs} | {plan.get('steps', '')} |")
    lines += [f"- {note}" for note in group["plans"][0]["notes"]]
    if found["misordered"]:
        lines += ["", "Misordered (predicted faster, measured slower by): " + ", ".join(
            f"{m['faster_predicted']} vs {m['faster_measured']} {_pct(m['gap'])}"
            + ("" if m["beyond_noise"] else " (inside the noise)") for m in found["misordered"])]
    return lines


def _warnings(launch: dict) -> list[str]:
    prov = launch["provenance"]
    out = []
    if provenance.busy(prov):
        out.append(f"the machine was busy ({provenance.load_line(prov)}): these times are not valid figures")
    out += [f"calibration: {w}" for w in launch["profile"]["warnings"]]
    out += [f"{g['name']} plan {n}: {len(p['errors'])} failed runs ({p['errors'][-1]})"
            for g in launch["groups"] for n, p in enumerate(g["plans"], 1) if p["errors"]]
    return out


if __name__ == "__main__":
    sys.exit(main())
