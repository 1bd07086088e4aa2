"""The progress bar of the long commands: drawn with the time left on a terminal, silent
in a log file or a pipe (the tables after it are the record)."""

from __future__ import annotations

import io

from rich.console import Console

from trainwise.cli.progress_bar import progress_bar


def test_a_terminal_gets_a_bar_with_the_time_left(monkeypatch):
    # A console that is a capable terminal whatever this process's environment and capture
    # say: one full-suite run saw no bar through the environment and capsys (rich draws a
    # transient bar on no dumb terminal, TERM=dumb, which CI shells may set).
    monkeypatch.setenv("TERM", "xterm-256color")
    terminal = io.StringIO()
    with progress_bar(Console(file=terminal, force_terminal=True, width=100)) as report:
        for done in range(3):
            report(done, 3, "bench rows")
        report(3, 3, "bench rows")
    assert "bench rows" in terminal.getvalue() and "left" in terminal.getvalue()


def test_a_pipe_gets_nothing(monkeypatch, capsys):
    for name in ("FORCE_COLOR", "TTY_INTERACTIVE", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    with progress_bar() as report:
        report(0, 2, "screening plans")
        report(2, 2, "screening plans")
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_pipe_gets_throttled_lines_when_asked(monkeypatch):
    # train --plan auto: its search must show in a log, as the steps after it do.
    import trainwise.cli.progress_bar as bar

    clock = iter([0.0, 1.0, 2.0, 7.0, 8.0])
    monkeypatch.setattr(bar.time, "monotonic", lambda: next(clock))
    log = io.StringIO()
    with progress_bar(Console(file=log, force_terminal=False), lines=True) as report:
        for done in range(4):
            report(done, 10, "screening plans")
        report(0, 3, "confirming")
    assert log.getvalue().splitlines() == ["screening plans: 0/10", "screening plans: 3/10", "confirming: 0/3"]
