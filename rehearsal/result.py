"""What a rehearsal ended with (pure): the result a planned target carries, and the kaniko call it compared.

Why a module of its own: ``domain/buildset.py``'s ``TargetSpec`` carries a ``RehearsalResult`` while the
rest of the pure part (rehearsal/model.py) takes a ``TargetSpec``; with the result types here, buildset
imports this leaf and model.py imports buildset, and no import goes round in a circle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class KanikoCall(BaseModel):
    """The kaniko executor flags a build script passed (both `--flag value` and `--flag=value`)."""

    destinations: list[str] = Field(default_factory=list)
    cache_repo: str | None = None
    cache: bool | None = None
    build_args: dict[str, str] = Field(default_factory=dict)
    dockerfile: str | None = None
    context: str | None = None
    platform: str | None = None  # --custom-platform (None: kaniko builds for its host)
    target: str | None = None
    skip_unused_stages: bool = False
    no_push: bool = False  # --no-push: builds, pushes nothing
    context_sub_path: str | None = None
    line: str | None = None  # the build script's file:line that ran it
    error: str | None = None  # kaniko's own argv error (it exits on it before building): "unknown flag: --squash"


class Difference(BaseModel):
    field: str
    planned: str
    script: str
    planned_source: str = ""
    script_source: str = ""  # the script's file:line that asked for it
    text: str = ""  # a difference that is not "the plan has X, the script Y" says itself

    def describe(self) -> str:
        if self.text:
            return self.text
        src = f" ({self.planned_source})" if self.planned_source else ""
        at = f" at {self.script_source}" if self.script_source else ""
        return f"{self.field}: the plan has {self.planned}{src}, the script asked kaniko for {self.script}{at}"


class RehearsalResult(BaseModel):
    """How one target's rehearsal ended; ``status`` "passed", "failed" or "skipped" (with ``reason``)."""

    status: Literal["passed", "failed", "skipped"]
    reason: str = ""
    seconds: float = 0.0
    line: str | None = None  # "file:line" of the script statement that failed
    exit_code: int | None = None
    stderr_tail: list[str] = Field(default_factory=list)
    kaniko: KanikoCall | None = None
    differences: list[Difference] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)  # stand-ins the script called, in order, once each
    root: str = ""  # the task image userland it ran in (reference, platform, manifest digest)
    # "file:line" of the first step the rehearsal could not run (a program a stood-in interpreter was
    # given, a download with no stand-in content): what follows depends on it and was not rehearsed.
    unrehearsed_from: str | None = None
    unrehearsed_accepted: bool = False  # the operator planned anyway with --accept-unrehearsed

    def describe(self) -> str:
        if self.status == "passed":
            return (f"rehearsal passed in {self.seconds:.1f} s (stand-ins: {', '.join(self.tools) or 'none'})"
                    + (f" in {self.root}" if self.root else ""))
        if self.status == "skipped" and self.unrehearsed_from:
            return (f"rehearsal incomplete: unrehearsed from {self.unrehearsed_from}: {self.reason}"
                    + (" (accepted by the operator with --accept-unrehearsed)" if self.unrehearsed_accepted else ""))
        if self.status == "skipped":
            return f"rehearsal skipped: {self.reason}"
        return f"rehearsal failed: {self.reason}"
