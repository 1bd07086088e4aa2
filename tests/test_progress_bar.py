"""The progress bar of the long commands: drawn with the time left on a terminal, silent
in a log file or a pipe (the tables after it are the record)."""

from __future__ import annotations

from trainwise.cli.progress_bar import progress_bar


def test_a_terminal_gets_a_bar_with_the_time_left(monkeypatch, capsys):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    with progress_bar() as report:
        for done in range(3):
            report(done, 3, "bench rows")
        report(3, 3, "bench rows")
    err = capsys.readouterr().err
    assert "bench rows" in err and "left" in err


def test_a_pipe_gets_nothing(monkeypatch, capsys):
    for name in ("FORCE_COLOR", "TTY_INTERACTIVE", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    with progress_bar() as report:
        report(0, 2, "screening plans")
        report(2, 2, "screening plans")
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
