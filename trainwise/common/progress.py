"""How long work reports how far it has got: a callback the caller may give.

`report(done, total, what)`: `done` units of `total` finished (`total` None when the
count is not known ahead), `what` names the work in words. The layers that do long work
(the plan search, the bench ladder, verification runs) take one and call it as they go;
the command line draws it as a bar with the time left (cli/progress_bar.py). Without
one, nothing is reported."""

from __future__ import annotations

from typing import Callable

Progress = Callable[[int, "int | None", str], None]


def silent(done: int, total: int | None, what: str) -> None:
    """The progress callback that reports nothing (the default)."""
