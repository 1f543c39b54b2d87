"""The operator CLI's exit codes and its one-line command error.

Why apart from ``runtime.operator_client``: that module imports the Temporal client and the workflows
(about half a second); the starter refuses bad input with these codes before it needs any of that.
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class CommandError(Exception):
    """A command cannot do what was asked: one line for the operator and the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.message = message
        self.code = code
