"""The Weights & Biases report: the metrics lines logged at their steps, the plan as the
run's config. Offline unless the user configured wandb (WANDB_MODE, WANDB_API_KEY, or a
login in ~/.netrc): a training run never uploads anything the user did not ask for."""

from __future__ import annotations

import netrc
import os
from pathlib import Path


def wandb_mode() -> str:
    """online only when the user set wandb up; otherwise offline (`wandb sync` uploads later)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        logged_in = netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        logged_in = False
    return "online" if logged_in else "offline"


class WandbReport:
    name = "wandb"

    def __init__(self, directory: Path, hparams: dict, resume_from_step: int | None):
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        self.mode = wandb_mode()
        self.directory = directory
        self.run = wandb.init(dir=str(directory), mode=self.mode, config=hparams,
                              project=os.environ.get("WANDB_PROJECT", "trainwise"), reinit="create_new")
        self.first_step = resume_from_step + 1 if resume_from_step is not None else None

    def step(self, line: dict) -> None:
        values = {key: value for key, value in line.items() if key != "step" and value is not None}
        self.run.log(values, step=line["step"])

    def summary(self, summary: dict) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str)) or value is None:
                self.run.summary[key] = value

    def close(self) -> None:
        self.run.finish()

    def describe(self) -> str:
        where = self.run.dir if self.run is not None else self.directory
        return f"wandb {self.mode} {where}" + (" (upload with `wandb sync`)" if self.mode == "offline" else "")
