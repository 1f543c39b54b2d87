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


class ImageRead(BaseModel):
    """One image the build will pull, as the rehearsal saw it asked for (after ARG expansion)."""

    reference: str  # as the build names it (`nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.04`)
    platform: str | None  # os/architecture[/variant] it must exist for; None: any (a crane digest/copy of an index)
    source: str  # file:line that names it (the Dockerfile's FROM, or the build script's crane line)
    what: str  # "FROM", "COPY --from", "crane export", ...
    probe: bool = False  # a crane digest/manifest/config: the script asks whether it exists (the stand-in said yes)


class ImageCheck(BaseModel):
    """The registry's answer for one ImageRead (rehearsal/images.py); ``status`` "found", "missing" (no such
    tag, digest or repository), "no_platform" (no manifest for the platform), "unauthorized" (refused to the
    credentials the job has for that host) or "unchecked" (the registry did not answer: never a pass)."""

    read: ImageRead
    status: Literal["found", "missing", "no_platform", "unauthorized", "unchecked"]
    answer: str  # the registry's own answer ("HTTP 404 MANIFEST_UNKNOWN", "index has linux/amd64 only", ...)
    asked: str = ""  # which registry was asked, how, and from which config key (a mirror, the job's credentials)
    digest: str | None = None  # the platform manifest's digest when found

    def describe(self) -> str:
        r = self.read
        plat = f" for {r.platform}" if r.platform else ""
        head = f"{r.source}: {r.what} {r.reference}{plat}"
        if self.status == "found":
            return f"{head}: found ({self.digest or 'present'}; {self.asked})"
        if self.status == "unchecked":
            return f"{head}: unchecked, the registry did not answer ({self.answer}; {self.asked})"
        return f"{head}: {self.answer} ({self.asked})"


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
    images: list[ImageRead] = Field(default_factory=list)  # every image the build pulls (rehearsal/model.py)
    image_checks: list[ImageCheck] = Field(default_factory=list)  # their registry answers (rehearsal/images.py)

    def images_note(self) -> str:
        """What the registry look-up of the build's images found, for the report ('' when none was made)."""
        if not self.image_checks:
            return ""
        found = [c for c in self.image_checks if c.status == "found"]
        unchecked = [c for c in self.image_checks if c.status == "unchecked"]
        note = f"; {len(found)} of {len(self.image_checks)} pulled image(s) found in their registries" + (
            " (" + ", ".join(f"{c.read.reference}" + (f" {c.read.platform}" if c.read.platform else "")
                             + f" at {c.read.source.partition(' ')[0]}" for c in found) + ")" if found else "")
        if unchecked:
            note += "; UNCHECKED: " + "; ".join(c.describe() for c in unchecked) + (
                " (accepted by the operator with --accept-unrehearsed)" if self.unrehearsed_accepted else "")
        return note

    def describe(self) -> str:
        if self.status == "passed":
            return (f"rehearsal passed in {self.seconds:.1f} s (stand-ins: {', '.join(self.tools) or 'none'})"
                    + (f" in {self.root}" if self.root else "") + self.images_note())
        if self.status == "skipped" and self.unrehearsed_from:
            return (f"rehearsal incomplete: unrehearsed from {self.unrehearsed_from}: {self.reason}"
                    + (" (accepted by the operator with --accept-unrehearsed)" if self.unrehearsed_accepted else "")
                    + self.images_note())
        if self.status == "skipped":
            return f"rehearsal skipped: {self.reason}" + self.images_note()
        return f"rehearsal failed: {self.reason}"
