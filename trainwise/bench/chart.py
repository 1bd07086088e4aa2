"""The bench chart: per row, measured peak memory (bars) with the prediction (markers),
and throughput (the median, with whiskers from the slowest to the fastest sample); trainwise
and the Trainer baseline side by side. It shows no ratio: the table says when one is trusted."""

from __future__ import annotations

from pathlib import Path

from trainwise.common.atomic import atomic_write_bytes

MIB = 1024**2


def save_chart(rows: list[dict], path: Path, title: str) -> Path:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(row["name"] for row in rows))
    engines = [e for e in ("trainwise", "hf-trainer") if any(r["engine"] == e for r in rows)]
    width = 0.8 / max(1, len(engines))
    figure, (memory_axis, speed_axis) = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(names) + 3), 8), sharex=True)
    for offset, engine in enumerate(engines):
        by_name = {r["name"]: r for r in rows if r["engine"] == engine}
        xs = [i + (offset - (len(engines) - 1) / 2) * width for i in range(len(names))]
        measured = [_mib(_memory(by_name.get(n))) for n in names]
        # No marker (NaN) where there is no prediction, rather than one at zero.
        predicted = [_mib((by_name.get(n) or {}).get("predicted", {}).get("peak_allocated")) or float("nan")
                     for n in names]
        speed = [(by_name.get(n) or {}).get("samples_per_s") or 0 for n in names]
        label = "trainwise" if engine == "trainwise" else "HF Trainer (baseline)"
        memory_axis.bar(xs, measured, width, label=f"{label}: measured peak")
        if engine == "trainwise":
            memory_axis.scatter(xs, predicted, marker="D", color="black", zorder=3, label="predicted peak")
        speed_axis.bar(xs, speed, width, label=label, yerr=_whiskers([by_name.get(n) for n in names], speed),
                       capsize=3)
        for x, n in zip(xs, names):
            status = (by_name.get(n) or {}).get("status")
            if status and status != "ok":
                memory_axis.annotate(status, (x, 0), rotation=90, ha="center", va="bottom", fontsize=8)
    memory_axis.set_ylabel("peak allocated (MiB, measured)")
    speed_axis.set_ylabel("samples/s (measured, median; min-max)")
    speed_axis.set_xticks(range(len(names)), names, rotation=30, ha="right")
    memory_axis.legend(fontsize=8)
    speed_axis.legend(fontsize=8)
    memory_axis.set_title(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def _whiskers(rows: list[dict | None], medians: list[float]) -> list[list[float]]:
    """Below and above each bar: from the row's slowest to its fastest sample (none without a spread)."""
    low, high = [], []
    for row, median in zip(rows, medians):
        spread = (row or {}).get("spread") or {}
        low.append(max(0.0, median - spread["min"]) if spread.get("min") else 0.0)
        high.append(max(0.0, spread["max"] - median) if spread.get("max") else 0.0)
    return [low, high]


def _memory(row: dict | None):
    return (row or {}).get("measured", {}).get("peak_allocated")


def _mib(value) -> float:
    return value / MIB if value else 0.0
