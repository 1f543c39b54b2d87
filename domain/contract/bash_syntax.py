"""Does a shell script parse as bash? (pure; tree-sitter-bash)

Why tree-sitter rather than ``bash -n``: it is a well-kept bash grammar that runs in-process (no
subprocess in the domain, no dependence on the worker's bash) and names the line of each error. A
script Iris would only reject at run time (e.g. an unterminated ``: "${VAR:?`` guard) is refused
before anything is submitted.
"""

from __future__ import annotations

import tree_sitter
import tree_sitter_bash

_PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def bash_syntax_errors(text: str, *, limit: int = 5) -> list[tuple[int, str]]:
    """(1-based line, that line's text) of each syntax error, outermost first; empty when the script parses."""
    source = text.encode()
    tree = _PARSER.parse(source)
    if not tree.root_node.has_error:
        return []
    lines = text.splitlines()
    found: list[tuple[int, str]] = []
    stack = [tree.root_node]
    while stack and len(found) < limit:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            row = node.start_point[0]
            entry = (row + 1, lines[row].strip() if row < len(lines) else "")
            if entry not in found:
                found.append(entry)
            continue
        if node.has_error:
            stack.extend(reversed(node.children))
    return found or [(1, "the script does not parse as bash")]
