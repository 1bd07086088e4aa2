"""`--report-to`: dashboards that receive what the metrics file logs.

Each report is a mirror of the metrics file (`engine/metrics.py` calls its `step(line)` and
`summary(summary)`, then `close()`), opened on rank 0 only, with the plan and the run
settings as hyperparameters. The event files go to `--report-dir`, by default `runs/`
under `--out`, else beside the `--metrics` file; a run with neither has nowhere to put
them and is refused before it starts. The loss and throughput chart (`run_chart.py`) is a
mirror too, written beside the metrics file at the end of every run that has one (unless
--no-chart: the bench's rows, timed in fresh processes, skip it)."""

from __future__ import annotations

from pathlib import Path

from trainwise.common.errors import InputError

TARGETS = ("none", "tensorboard", "wandb")
INSTALL = {"tensorboard": "pip install tensorboard", "wandb": "pip install wandb"}


def report_targets(text: str) -> tuple[str, ...]:
    """The dashboards `--report-to a,b` names (() for none); InputError listing the allowed."""
    names = [part.strip() for part in (text or "none").split(",") if part.strip()]
    unknown = [name for name in names if name not in TARGETS]
    if unknown or not names:
        raise InputError("--report-to", f"{', '.join(unknown) or repr(text)} is not a dashboard; allowed: "
                                        f"{', '.join(TARGETS)} (several comma-separated)")
    if "none" in names and len(names) > 1:
        raise InputError("--report-to", "none cannot be combined with a dashboard")
    return tuple(dict.fromkeys(n for n in names if n != "none"))


def report_directory(run) -> Path | None:
    """Where dashboards write: --report-dir, else <--out>/runs, else beside --metrics."""
    if run.report_dir:
        return Path(run.report_dir)
    if run.output:
        return Path(run.output) / "runs"
    if run.metrics:
        return Path(run.metrics).parent / (Path(run.metrics).stem + "-runs")
    return None


def check_reports(run) -> None:
    """Before any work: the dashboards named exist here and have a directory to write to."""
    targets = report_targets(run.report_to)
    if not targets:
        return
    if report_directory(run) is None:
        raise InputError("--report-to", "needs somewhere to write its logs: add --out DIR, --metrics FILE "
                                        "or --report-dir DIR")
    import importlib.util

    for target in targets:
        if importlib.util.find_spec(target) is None:
            raise InputError("--report-to", f"{target} is not installed: {INSTALL[target]}")


def open_reports(run, plan, resume_from_step: int | None) -> list:
    """The mirrors of this run's metrics file: each dashboard named, and the chart when the
    run writes a metrics file."""
    from trainwise.engine.run_chart import RunChart

    mirrors = []
    targets = report_targets(run.report_to)
    hparams = {**{f"plan/{k}": v for k, v in plan.to_dict().items()},
               **{f"run/{k}": v for k, v in run.to_dict().items()}}
    directory = report_directory(run)
    if "tensorboard" in targets:
        from trainwise.engine.report_tensorboard import TensorBoardReport

        mirrors.append(TensorBoardReport(directory / "tensorboard", hparams, resume_from_step))
    if "wandb" in targets:
        from trainwise.engine.report_wandb import WandbReport

        mirrors.append(WandbReport(directory / "wandb", hparams, resume_from_step))
    if run.metrics and not run.no_chart:
        mirrors.append(RunChart(Path(run.metrics).with_suffix(".png")))
    return mirrors
