"""A progress bar with the time left, on standard error, for the long commands.

Drawn only on a terminal and cleared when the work ends (the tables that follow are the
record); a log file or a pipe gets nothing from it, unless the command asks for lines
(`lines=True`: `train --plan auto`, whose search is followed by a run that logs each step,
so a log shows the search going too). The estimate of the time left is the
mean time per finished unit so far times the units left: rich's own column."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

from trainwise.common.progress import Progress


@contextlib.contextmanager
def progress_bar(console=None, lines: bool = False) -> Iterator[Progress]:
    """A Progress callback drawing one bar per kind of work (`what`), on `console` (a
    rich Console; standard error by default). Off a terminal, with `lines`: a plain line
    when a kind of work starts and then at most every LINE_EVERY_S seconds."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.progress import Progress as RichProgress

    console = console if console is not None else Console(stderr=True)
    if not console.is_terminal:
        yield _line_reporter(console) if lines else _nothing
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    with RichProgress(*columns, console=console, transient=True) as bars:
        tasks: dict[str, int] = {}

        def report(done: int, total: int | None, what: str) -> None:
            if what not in tasks:
                tasks[what] = bars.add_task(what, total=total)
            bars.update(tasks[what], completed=done, total=total)

        yield report


LINE_EVERY_S = 5.0


def _line_reporter(console) -> Progress:
    last: dict[str, float] = {}

    def report(done: int, total: int | None, what: str) -> None:
        now = time.monotonic()
        if what in last and now - last[what] < LINE_EVERY_S:
            return
        last[what] = now
        console.print(f"{what}: {done}/{total}" if total else f"{what}: {done}", soft_wrap=True)
    return report


def _nothing(done: int, total: int | None, what: str) -> None:
    pass
