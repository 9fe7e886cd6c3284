"""The one error type of the library. The CLI prints it as a single line and exits non-zero."""


class TilewiseError(Exception):
    """A user-facing error: the message says what is wrong and how to fix it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message} ({hint})")

    def __str__(self) -> str:  # one line, always
        text = self.message if not self.hint else f"{self.message}; {self.hint}"
        return " ".join(text.split())


class UsageError(TilewiseError):
    """Bad input from the user (flags, files, descriptions)."""

    exit_code = 2
