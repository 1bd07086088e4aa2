"""trainwise/search/tie_error.json: the step-time model's measured error within one model,
per device kind, which the planner's tie rule reads (trainwise/search/ties.py).

    python benchmarks/tie_error.py            # write the package data from the committed results
    python benchmarks/tie_error.py --check    # exit 1 when the package data is not what the results give

The figure is read from committed results, never typed in: the time-model pages
(docs/results/time-model-*.md, written by benchmarks/time_model.py) and, where it has been
run, the planner-regret rows (docs/results/rows/planner-regret-*.json, benchmarks/planner_regret.py).
Their plans are grouped by model and sequence length (what one search ranks); within a group
each plan's measured/predicted ratio is divided by the group's median ratio, and the
figure is the median of |that - 1| over all plans: how far, typically, one plan's predicted
time is off relative to the other plans of its search once the error they share (a
profile too fast or too slow for this machine, which does not change an order) is taken
out. Two plans whose predicted times differ by less than that cannot be told apart by the
model. A device kind whose results hold no group of 3 or more plans gets no figure (no ties).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import provenance

provenance.add_repo_to_path()

OUT = provenance.REPO / "trainwise" / "search" / "tie_error.json"
RESULTS = provenance.REPO / "docs" / "results"
MIN_GROUP = 3  # fewer plans leave a median ratio that one plan decides


def time_model_pairs(page: Path) -> tuple[str, list[tuple[str, float, float]]]:
    """(device kind, [(group, predicted s, measured s)]) from a time-model page's plan table;
    the group is the plan name's first two words (model and sNNN)."""
    text = page.read_text()
    kind = "cuda" if "GPU " in provenance.parse(text).get("device", "") else "cpu"
    rows, columns = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| plan |"):
            columns = cells
            continue
        if not line.startswith("|"):
            columns = None  # the table ended
        if columns is None or len(cells) != len(columns) or cells[0].startswith("---"):
            continue
        predicted = cells[next(i for i, c in enumerate(columns) if c.startswith("predicted"))]
        measured = cells[next(i for i, c in enumerate(columns) if c.startswith("measured"))]
        if re.fullmatch(r"[0-9.]+", predicted) and re.fullmatch(r"[0-9.]+", measured) and float(measured) > 0:
            rows.append((" ".join(cells[0].split()[:2]), float(predicted), float(measured)))
    return kind, rows


def regret_pairs(path: Path) -> tuple[str, list[tuple[str, float, float]]]:
    """(device kind, [(group, predicted s, measured s)]) from a planner-regret rows file."""
    launch = json.loads(path.read_text())["launches"][-1]
    rows = [(group["name"], plan["predicted_s"], statistics.median(plan["repeats_s"])) for group in launch["groups"]
            for plan in group["plans"] if plan.get("predicted_s") and plan["repeats_s"]]
    return launch["device_kind"], rows


def error_within_groups(rows: list[tuple[str, float, float]]) -> dict | None:
    """{"error_pct", "plans", "groups"}: the median over plans of |ratio / group median ratio - 1|."""
    groups: dict[str, list[float]] = {}
    for group, predicted, measured in rows:
        groups.setdefault(group, []).append(measured / predicted)
    kept = {g: ratios for g, ratios in groups.items() if len(ratios) >= MIN_GROUP}
    if not kept:
        return None
    deviations = [abs(r / statistics.median(ratios) - 1) for ratios in kept.values() for r in ratios]
    return {"error_pct": round(100 * statistics.median(deviations), 1), "plans": len(deviations),
            "groups": len(kept)}


def figures() -> dict:
    """{device kind: {"error_pct", "plans", "groups", "sources"}} from the committed results."""
    found: dict[str, tuple[list, list[str]]] = {}
    sources = [(p, time_model_pairs) for p in sorted(RESULTS.glob("time-model-*.md")) if "published" not in p.name]
    sources += [(p, regret_pairs) for p in sorted((RESULTS / "rows").glob("planner-regret-*.json"))]
    for path, read in sources:
        kind, rows = read(path)
        if rows:
            pairs, names = found.setdefault(kind, ([], []))
            # Groups of different files are kept apart: a page's group is its own search.
            pairs += [(f"{path.name}: {group}", p, m) for group, p, m in rows]
            names.append(str(path.relative_to(provenance.REPO)))
    out = {}
    for kind, (pairs, names) in sorted(found.items()):
        error = error_within_groups(pairs)
        if error is not None:
            out[kind] = {**error, "sources": names}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the package data, write nothing")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    text = json.dumps({"written_by": "benchmarks/tie_error.py", "figures": figures()}, indent=2) + "\n"
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(provenance.REPO)} is {'up to date' if same else 'stale: run python benchmarks/tie_error.py'}")
        return 0 if same else 1
    provenance.write_page(OUT, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
