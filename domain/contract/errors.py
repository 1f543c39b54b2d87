"""The errors the contract parsers raise: fail closed, and say exactly where and what was expected."""

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


class ParserNeedsAttention(ContractError):
    """A field the service needs could not be read from a file that is otherwise valid.

    Why separate: the upstream file is not wrong (bash and Docker accept it); our reader does not yet
    understand this shape. The message says so, so nobody "fixes" the upstream repository for us.
    """

    def __init__(self, file: str, line: int, field: str, detail: str, parser: str):
        self.field = field
        super().__init__(file, line, f"to read the {field} ({detail})",
                         None)
        where = f"{file}:{line}" if line else file
        self.args = (f"{where}: cannot determine the {field}: {detail}. The upstream file may be fine; "
                     f"the parser ({parser}) needs attention before this commit can be built",)

    def __str__(self) -> str:
        return self.args[0]
