"""The TensorBoard report: every number of a metrics line as a scalar at its step, the
plan as hyperparameters (shown with the run's summary), through PyTorch's SummaryWriter."""

from __future__ import annotations

from pathlib import Path

# Metrics-line keys that are not a value over steps.
NOT_SCALARS = ("step", "skipped")


class TensorBoardReport:
    """Event files under `directory`. A resumed run drops the events after its checkpoint
    (`purge_step`), as the metrics file drops its lines."""

    name = "tensorboard"

    def __init__(self, directory: Path, hparams: dict, resume_from_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.directory = directory
        self.hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
        purge = resume_from_step + 1 if resume_from_step is not None else None
        self.writer = SummaryWriter(log_dir=str(directory), purge_step=purge)

    def step(self, line: dict) -> None:
        for key, value in line.items():
            if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.writer.add_scalar(scalar_tag(key), value, line["step"])
        self.writer.flush()  # a run that dies later keeps every step it logged

    def summary(self, summary: dict) -> None:
        finals = {f"summary/{k}": v for k, v in summary.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.writer.add_hparams(self.hparams, finals, run_name=".")

    def close(self) -> None:
        self.writer.close()

    def describe(self) -> str:
        return f"tensorboard {self.directory} (tensorboard --logdir {self.directory})"


def scalar_tag(key: str) -> str:
    """The TensorBoard tag of a metrics key: grouped as the dashboards group them."""
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    if key in ("peak_allocated",):
        return "memory/peak_allocated_bytes"
    return "train/" + key
