"""The one error type users see: bad input, reported as FILE: key.path: what is wrong and what is allowed."""

from __future__ import annotations


class InputError(Exception):
    """Bad user input. The CLI prints it on one line and exits with code 2."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        self.file = file
        self.key = key
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.file, self.key) if part)
        return f"{where}: {self.message}" if where else self.message
