"""The docs generated from the code, by path: ``scripts/gen-docs`` writes them, a test compares them.

Why one registry: a new generated page needs one line here, and the script and the staleness test
pick it up without further changes."""

from __future__ import annotations

from collections.abc import Callable

from domain.config_reference import configuration_markdown
from domain.troubleshooting import troubleshooting_markdown

GENERATED: dict[str, Callable[[], str]] = {
    "docs/configuration.md": configuration_markdown,
    "docs/troubleshooting.md": troubleshooting_markdown,
}
