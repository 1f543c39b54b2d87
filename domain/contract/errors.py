"""The one error the contract parsers raise: fail closed, and say exactly where and what was expected."""

from __future__ import annotations


class ContractError(ValueError):
    """A build-contract file has a shape the parser does not recognize (or lacks a required part).

    ``line`` is 1-based; 0 means the whole file (e.g. a missing file or section).
    """

    def __init__(self, file: str, line: int, expected: str, found: str | None = None):
        self.file = file
        self.line = line
        self.expected = expected
        self.found = found
        where = f"{file}:{line}" if line else file
        msg = f"{where}: expected {expected}"
        if found is not None:
            msg += f"; found {found!r}"
        super().__init__(msg)
