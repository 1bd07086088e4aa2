"""Errors that mean "the user asked for something that cannot be": exit code 2."""


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
