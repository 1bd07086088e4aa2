"""trainwise's samples/s over the Trainer's for one rung, given only when it can be trusted.

The ratio of the two rows' medians is shown when both rows' samples spread by at most
10 % and the machine was quiet when they ran (trainwise.common.noise.confident_ratio);
otherwise its place says why. A bench on a busy 2-core machine once printed a 37x
"speed-up" that was another process taking the CPU during the Trainer's row."""

from __future__ import annotations

from trainwise.common.noise import Ratio, Spread, confident_ratio


def row_spread(row: dict) -> Spread:
    """The row's samples/s samples (its own rate alone for a row without a spread)."""
    samples = (row.get("spread") or {}).get("samples")
    return Spread.of(samples if samples else [row.get("samples_per_s")])


def baseline_ratio(row: dict, baseline: dict | None) -> Ratio | None:
    """For a trainwise "ok" row with an "ok" Trainer row of the same rung; else None."""
    if row.get("engine") != "trainwise" or row.get("status") != "ok" or not baseline \
            or baseline.get("status") != "ok":
        return None
    return confident_ratio(row_spread(row), row_spread(baseline), busy=row.get("busy") or baseline.get("busy"))


def add_baseline_ratios(rows: list[dict]) -> None:
    """Set "vs_baseline" ({"ratio", "withheld"}) on each trainwise row that has a Trainer row."""
    baseline = {r["name"]: r for r in rows if r.get("engine") == "hf-trainer"}
    for row in rows:
        ratio = baseline_ratio(row, baseline.get(row["name"]))
        if ratio is not None:
            row["vs_baseline"] = ratio.to_json()
