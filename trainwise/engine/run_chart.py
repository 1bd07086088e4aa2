"""The chart of a run: loss (and evaluation loss) and throughput over the steps, a PNG
beside the metrics file, written atomically when the run ends."""

from __future__ import annotations

import io
from pathlib import Path

from trainwise.common.atomic import atomic_write_bytes


class RunChart:
    """Collects the metrics lines it is given and draws them at the run's summary."""

    name = "chart"

    def __init__(self, path: Path):
        self.path = path
        self.lines: list[dict] = []

    def step(self, line: dict) -> None:
        self.lines.append(line)

    def summary(self, summary: dict) -> None:
        if self.lines:
            atomic_write_bytes(self.path, chart_png(self.lines, summary))

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return f"chart {self.path}"


def chart_png(lines: list[dict], summary: dict) -> bytes:
    """Two panels: measured loss per step (training, and evaluation where logged), and
    measured tokens/s per step with the run's figure (the summary's: over the timed steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [line["step"] for line in lines]
    figure, (loss_axis, speed_axis) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    loss_axis.plot(steps, [_value(line, "loss") for line in lines], label="training loss (measured)")
    evals = [(line["step"], line["eval_loss"]) for line in lines if line.get("eval_loss") is not None]
    if evals:
        loss_axis.plot(*zip(*evals), "o-", label="evaluation loss (measured)")
    loss_axis.set_ylabel("loss")
    loss_axis.legend()
    speed_axis.plot(steps, [_value(line, "tokens_per_s") for line in lines], label="tokens/s (job) per step (measured)")
    if summary.get("tokens_per_s"):
        speed_axis.axhline(summary["tokens_per_s"], color="black", linestyle="--",
                           label="run, timed steps (measured)")
    speed_axis.set_ylabel("tokens/s (job)")
    speed_axis.set_xlabel("optimizer step")
    speed_axis.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def _value(line: dict, key: str) -> float:
    value = line.get(key)
    return float("nan") if value is None else value
