"""The errors trainwise maps to exit codes (2 bad input, 3 out of memory, 4 a write
failed, 128 + N stopped by signal N), and how a library's error becomes part of one line."""

from __future__ import annotations

import signal
from pathlib import Path


class InputError(ValueError):
    """Bad input, reported as one line naming the field and what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class NotSupportedYet(InputError):
    """A declared knob whose implementation has not landed for this command yet."""

    def __init__(self, field: str, what: str):
        super().__init__(field, f"not supported yet by {what}")


class OutOfMemory(RuntimeError):
    """The device ran out of memory: exit code 3. The message says what was needed and
    which knob changes would fit (as far as the estimate knows)."""


class WriteFailed(RuntimeError):
    """A checkpoint or result file could not be written (disk full, no permission): exit
    code 4. The message names what was kept intact."""


class Preempted(Exception):
    """A training run (engine/preemption.py) stopped on a signal: the run stopped on a signal after `step` of `total` steps; `checkpoint` is where it
    was saved (None: no --out, nothing saved). `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, total: int, checkpoint: Path | None):
        self.signum, self.step, self.total, self.checkpoint = signum, step, total, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        where = (f"checkpoint saved in {checkpoint}; continue with --resume" if checkpoint is not None
                 else "nothing could be saved (no --out): rerun with --out DIR to keep progress")
        super().__init__(f"stopped by {name} after step {step} of {total}; {where}")


def first_line(err: BaseException) -> str:
    """The first line of an error's message (libraries raise multi-line ones), or its type
    name when it has none: what a one-line refusal quotes."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
