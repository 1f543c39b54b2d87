"""Judging a succeeded build when its log cannot be trusted to hold every line (pure).

What the log store's ``seq`` is (measured on the 0.2.227 local controller, ``bench/log_loss.py``): a
store-wide row id, starting at 1 with the first line any job ever wrote and shared by every key. A job's
lines are numbered contiguously only while nothing else writes; lines of concurrent jobs take ids in
between. The loss the store suffers happens before that numbering: the worker's finelog client keeps at
most 10,000 unsent rows (all tasks of the worker together) and silently drops the OLDEST when a burst
exceeds that within its 1 s flush interval. A 20,000-line burst after a marker kept the newest 10,000
lines, numbered without a single gap, and lost the marker. So:

- a gap in a job's ``seq`` is either another key's lines (harmless) or rows the store itself lost; the
  activity asks the store which (``unexplained_gaps``) when a marker is missing, and only a confirmed hole
  makes the log gapped (a shown marker is proven whatever else the log lost);
- a seq-contiguous log can still have lost its beginning: a succeeded job's log proves the markers it
  shows, never that a marker is absent. A missing marker is therefore decided by the image the job pushed
  (``judge``), the evidence the store cannot drop, as far as it proves that the line was printed: its OCI
  labels (our build commit) and tag digest prove the push; a config-history step that IS the marker's RUN
  instruction (kaniko records it only after the step exited 0) proves a fixed, unguarded echo of that step's
  final `&&` chain. History never proves a value (`megatron=1`, a commit, a platform) or a branch, and text
  that merely holds the echo (a comment, another step) proves nothing. Where the image itself can answer (a
  marker printed by a `python -c` of a step that only tests and prints: the imports it reports), that step is
  run again in the image (``image_check_script``, ``read_image_run``, ``with_image_run``): what the image prints
  proves it, the excluded branch it prints fails the build, a failed or silent run proves nothing. An empty log
  is the same case with every marker missing.

``judge`` returns the verdict the target acts on: validated by the log, validated with the image standing
in (the report says the log was incomplete and which evidence stood in), ``log_lost`` when neither can
prove it, or ``contradicted`` when the build's own output shows a marker with another value or a branch the
plan excludes (an ``assertion_failure`` naming the line: a shown line is proven whatever else was lost). A
missing line alone is never an assertion failure: the log that would say so is the one in doubt.

A marker whose own RUN step kaniko took from its layer cache was never printed by this build, whatever the store
kept (domain/markers.py, the kaniko cache section: a hit proves only a line its step always prints). Where it stays
unproven its reason names the cached step, and where every unproven marker is such a one the judgement's
``cause`` is "cache": the target ends ``cache_unproven`` (domain/failures.py), whose next step bypasses the cache,
since a resume would take the same steps from it again. Not used as evidence: an earlier build's log of the
same layer. kaniko names the cache key both where it pushes a layer and where it reuses it, but a cancelled job's
log is not stored (only terminated), and a failed job's (capture_failure) is one file per request and job with no
index by cache key: finding the build that pushed a layer would mean reading every stored log, and that build's
plan (variant, values) would have to be matched too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field

from domain.markers import Marker, MarkerCheck, cache_unproven_reason, normal_step, own_output

# How many seq gaps the activity asks the store about; more are reported as not verified (no claim).
MAX_GAPS_VERIFIED = 20


class SeqGap(BaseModel):
    """Ids strictly between two consecutive entries of one job: ``after`` < id < ``before``."""

    key: str
    after: int
    before: int

    @property
    def ids(self) -> int:
        return self.before - self.after - 1


def seq_gaps(entries: Iterable[tuple[str, int]]) -> list[SeqGap]:
    """Gaps between consecutive entries of each key (attempt) of a job, given ``(key, seq)`` in store
    order. A gap is a candidate only: other keys' lines fill most of them (see the module docstring)."""
    last: dict[str, int] = {}
    gaps: list[SeqGap] = []
    for key, seq in entries:
        prev = last.get(key)
        if prev is not None and seq > prev + 1:
            gaps.append(SeqGap(key=key, after=prev, before=seq))
        last[key] = max(seq, prev or 0)
    return gaps


def unexplained_gaps(gaps: list[SeqGap], stored_ids: dict[tuple[int, int], int]) -> list[SeqGap]:
    """The gaps the store cannot account for: ``stored_ids[(after, before)]`` is how many rows of any
    key the store holds in that range; fewer than the range's size means rows the store lost."""
    return [g for g in gaps if (g.after, g.before) in stored_ids and stored_ids[(g.after, g.before)] < g.ids]


class LogIntegrity(BaseModel):
    """What the stored log itself shows about its completeness."""

    lines: int
    gaps_checked: int = 0
    gaps_unverified: int = 0
    holes: list[SeqGap] = Field(default_factory=list)  # confirmed: ids no key of the store holds

    @property
    def empty(self) -> bool:
        return self.lines == 0

    def reasons(self) -> list[str]:
        out = []
        if self.empty:
            out.append("the log store holds no line of the job (a succeeded build always prints)")
        for h in self.holes[:3]:
            out.append(f"the log store lost {h.ids} row(s) between seq {h.after} and {h.before} of {h.key}")
        if len(self.holes) > 3:
            out.append(f"... and {len(self.holes) - 3} more seq holes")
        return out


class ImageFacts(BaseModel):
    """What the registry showed of the image at the target's tag (clients/image_validator)."""

    ref: str  # repository:tag
    digest: str | None = None
    ours: bool = False  # the tag resolves and every OCI label check passed (revision = the build commit)
    not_ours_reason: str = ""  # why it is not ours: no image, a label that differs, no verdict
    history: list[str] = Field(default_factory=list)  # config history created_by, in order
    history_present: bool = False
    # Did this job push it (``built_by_job``)? True, False (it was at the tag before the submission: adopted),
    # None (cannot tell); ``built_why`` says from what. Adopted passes only where policy.allow_adopted_image.
    built_by_job: bool | None = None
    built_why: str = ""
    adoption_allowed: bool = False
    env_keys: list[str] = Field(default_factory=list)  # the names its config Env sets (base image's included)
    env_present: bool = False  # the config was read


def cached_values_confirmed(markers: list[Marker], check: MarkerCheck, image: ImageFacts | None) -> MarkerCheck:
    """A value marker a cache hit stood in for (``Marker.cache_proof``) keeps that proof only where the image this
    job pushed sets none of its variables in its config Env. Why: the Dockerfile shows every ENV of the stage chain,
    but not the base image's (an `nvidia/cuda` image sets CUDA_VERSION); an ENV wins over the ARG, so the cached
    step printed that value, not the planned one. The final image's Env holds every ENV in force at any step of its
    chain (ENV is inherited, never removed). Anything unread or not ours: the marker is missing again."""
    by_name = {m.name: m for m in markers}
    moved: dict[str, str] = {}
    for name in check.cached:
        m = by_name.get(name)
        if m is None or not m.cache_proof:
            continue
        if image is None or image.built_by_job is not True or not image.env_present:
            why = (image.not_ours_reason or image.built_why or "its config was not read") if image else \
                "the image was not inspected"
            moved[name] = cache_unproven_reason(m, None, f"its values are proven only where the image this job pushed "
                                                         f"sets none of {', '.join(m.cache_vars or m.values)} in "
                                                         f"its Env: {why}")
        elif set_by := [v for v in (m.cache_vars or m.values) if v in image.env_keys]:
            moved[name] = cache_unproven_reason(m, None, f"the image's config Env sets {', '.join(set_by)} (its "
                                                         "base image's ENV wins over the build arg the plan reads)")
    if not moved:
        return check
    return check.model_copy(update={"cached": [n for n in check.cached if n not in moved],
                                    "missing": [*check.missing, *moved],
                                    "cache_unproven": {**check.cache_unproven, **moved}})


def built_by_job(*, digest: str | None, platform_digest: str | None, pushed: str | None, before: dict | None,
                 created: str = "") -> tuple[bool | None, str]:
    """Whether the image at the tag is the one this job pushed: the log's own `Pushed` digest; else what the tag
    held when the job was submitted (``before``: activities/build.py records it before launching); else the
    image config's `created` time against that reading. An image that was there before is adopted."""
    if not digest:
        return None, "no image at the tag"
    if pushed:
        if pushed in (digest, platform_digest):
            return True, f"the log shows this job pushed {pushed}"
        return False, f"the log shows this job pushed {pushed}, but the tag holds {digest}"
    if before is None:
        return None, "no record of what the tag held before the job was submitted"
    ref = before.get("ref", "the tag")
    if before.get("known"):
        held = before.get("digest")
        if held != digest:
            return True, f"{ref} held {held or 'no image'} when the job was submitted and now holds {digest}"
        return False, f"{digest} was already at {ref} before the job was submitted"
    read_at = before.get("read_at_ms")
    when = _epoch_ms(created)
    if when is not None and read_at and when >= read_at:
        return True, f"the image config was created at {created}, after the submission"
    return None, (f"{before.get('note') or 'the tag was not read before the submission'}; the image config's "
                  f"created time ({created or 'none'}) is not after the submission")


def _epoch_ms(text: str) -> int | None:
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


class LogJudgement(BaseModel):
    verdict: Literal["log", "image", "log_lost", "contradicted"]
    found: list[str]
    missing: list[str]  # neither the log nor the image proves them
    cached: list[str] = Field(default_factory=list)
    final_push_seen: bool  # the final push is proven (by its log lines, or by the registry's tag)
    pushed_digest: str | None  # only ever from the log's `Pushed` line (the registry is asked separately)
    incomplete: list[str] = Field(default_factory=list)  # why the log is not complete evidence
    stood_in: dict[str, str] = Field(default_factory=dict)  # marker -> the image evidence that proved it
    reasons: list[str] = Field(default_factory=list)  # for log_lost: why, and what the image could not prove
    contradicted: list[str] = Field(default_factory=list)  # own-output lines against the plan (assertion_failure)
    unproven: dict[str, str] = Field(default_factory=dict)  # marker -> why neither the log nor the image proves it
    # Markers whose step kaniko took from its cache and that hit cannot prove (MarkerCheck.cache_unproven).
    from_cache: list[str] = Field(default_factory=list)

    @property
    def cause(self) -> Literal["log", "cache"]:
        """Why a ``log_lost`` verdict: "cache" where every unproven marker is one whose step kaniko took from its
        cache (this build never printed it, the store lost nothing of it: a `resume` reusing the cache proves
        nothing more), else "log"."""
        if self.verdict == "log_lost" and self.unproven and all(n in self.from_cache for n in self.unproven):
            return "cache"
        return "log"


def needs_image(check: MarkerCheck, integrity: LogIntegrity) -> bool:
    """The log alone does not prove the build: a marker or the final push is missing (an empty log misses
    all). Holes alone do not: a log that shows every marker proves them, whatever else it lost. A log that
    contradicts the plan needs nothing more: it fails."""
    if check.contradicted:
        return False
    return bool(check.missing) or not check.final_push_seen or integrity.empty


def _history_step(m: Marker, history: list[str]) -> bool:
    """A history entry IS the marker's RUN step (equal, not merely holding its text)."""
    if not m.step:
        return False
    want = normal_step(m.step)
    return any(normal_step(h) == want for h in history)


def _why_unprovable(m: Marker) -> str | None:
    """Why nothing but its own log line can prove ``m`` (None: the image may stand in)."""
    if m.carries_value:
        vals = ", ".join(f"{k}={v}" for k, v in m.values.items()) or "a value only the build knows"
        return f"it carries a value ({vals}): only a line showing it proves it, never a step's existence"
    if m.conditional:
        return "it is printed on a branch of its step: the step's existence does not say which branch ran"
    return None


def judge(markers: list[Marker], check: MarkerCheck, integrity: LogIntegrity,
          image: ImageFacts | None) -> LogJudgement:
    """The verdict on a succeeded job from its log and, where the log cannot prove a marker, its image.

    A log line of the build's own output that shows a marker with another value, or a branch the plan excludes,
    fails the build (``contradicted``: an assertion failure naming the line and the plan's expectation).

    Per missing marker, only what proves that the line was printed stands in, never text that resembles it:
    kaniko's final push by the registry serving our image at the tag; a script echo by our image at the tag when
    errexit covered it (``Marker.image_proof == "script"``: the script cannot have reached its final push
    without running it) and its text is fixed; a Dockerfile echo by a step of our image's config history that
    IS its RUN instruction, when the echo is fixed text, unguarded, and in the step's final `&&` chain (a zero
    exit ran it). A marker that carries a value (`megatron=1`, a commit, a platform) or is printed on a branch
    is proven only by its own line. "Our image" = the tag resolves and its revision/Harbor labels are ours."""
    base = dict(found=list(check.found), cached=list(check.cached), pushed_digest=check.pushed_digest,
                from_cache=[n for n in check.missing if n in check.cache_unproven])
    if check.contradicted:
        return LogJudgement(verdict="contradicted", missing=list(check.missing),
                            final_push_seen=check.final_push_seen, incomplete=integrity.reasons(),
                            contradicted=list(check.contradicted), reasons=list(check.contradicted), **base)
    if not needs_image(check, integrity):  # holes are still reported
        return LogJudgement(verdict="log", missing=[], final_push_seen=True, incomplete=integrity.reasons(), **base)
    incomplete = integrity.reasons()
    absent = [m for m in markers if m.name in check.missing]
    from_cache = [m for m in absent if m.name in check.cache_unproven]
    lost = [m for m in absent if m.name not in check.cache_unproven]
    if from_cache:
        incomplete.append(f"kaniko took the steps of {len(from_cache)} marker(s) from its cache (`Using caching "
                          "version of cmd`): this build never printed their lines, an earlier build did")
    if lost and not integrity.empty:
        incomplete.append(f"{len(lost)} marker(s) absent from the log of a succeeded job; the store drops a "
                          "worker's oldest unsent lines (finelog client, 10,000 rows) without leaving a seq gap, "
                          "so absence is not proof")
    cached_why = {m.name: check.cache_unproven[m.name] for m in from_cache}
    if image is None or not image.ours:
        why = image.not_ours_reason if image else "the image was not inspected"
        return LogJudgement(verdict="log_lost", missing=[m.name for m in absent], final_push_seen=check.final_push_seen,
                            incomplete=incomplete, **base,
                            unproven={m.name: cached_why.get(m.name, f"the image cannot stand in: {why}")
                                      for m in absent},
                            reasons=[f"the image cannot stand in for the lost log: {why}", *incomplete])
    adopted = ""
    if image.built_by_job is not True:
        if image.built_by_job is False and image.adoption_allowed:
            adopted = f"; adopted, not built by this job ({image.built_why}; policy.allow_adopted_image)"
        else:
            why = (f"adopted, not built by this job: {image.built_why} (policy.allow_adopted_image is false)"
                   if image.built_by_job is False else f"cannot tell whether this job pushed it: {image.built_why}")
            return LogJudgement(verdict="log_lost", missing=[m.name for m in absent],
                                final_push_seen=check.final_push_seen, incomplete=incomplete,
                                **{**base, "from_cache": []},  # the policy decides here, not the cache
                                unproven={m.name: why for m in absent},
                                reasons=[f"the image {image.ref}@{image.digest} cannot stand in for the lost log: "
                                         f"{why}", *incomplete])
    stood_in: dict[str, str] = {}
    unproven: dict[str, str] = {}
    for m in absent:
        if m.role in ("push", "pushed"):
            stood_in[m.name] = (f"registry: {image.ref} -> {image.digest} with our OCI labels"
                                + (f", pushed by this job ({image.built_why})" if not adopted else adopted))
            continue
        if (why := _why_unprovable(m)) is not None:
            unproven[m.name] = why
        elif m.source not in ("script", "kaniko"):
            if not m.must_run:
                unproven[m.name] = "its step can exit 0 without running it (not in the step's final `&&` chain)"
            elif _history_step(m, image.history):
                stood_in[m.name] = (f"image config history: its RUN step ({m.source}:{m.line}) is a step of the "
                                    "image, and that step's zero exit ran this fixed echo")
            else:
                unproven[m.name] = ("the image config has no history" if not image.history_present
                                    else f"no step of the image's config history is its RUN instruction "
                                         f"({m.source}:{m.line})")
        elif m.image_proof == "script":
            stood_in[m.name] = ("our image at the tag: the script stops at its first error (errexit covers this "
                                "echo) and prints it before its final kaniko push")
        else:
            unproven[m.name] = (f"a {m.source} line the image does not record" if m.source != "script" else
                                "a script line errexit does not cover: the script can reach its push without it")
        if m.name in unproven and m.name in cached_why:  # the cause is the cache, not the store: say so
            unproven[m.name] = cached_why[m.name]
    found = [*check.found, *stood_in]
    common = dict(found=found, cached=list(check.cached), pushed_digest=check.pushed_digest, incomplete=incomplete,
                  stood_in=stood_in, final_push_seen=True, from_cache=base["from_cache"])
    if unproven:
        j = LogJudgement(verdict="log_lost", missing=list(unproven), unproven=unproven, **common)
        return j.model_copy(update={"reasons": unproven_reasons(j, f"{image.ref}@{image.digest}")})
    return LogJudgement(verdict="image", missing=[], **common)


def unproven_reasons(j: LogJudgement, ref: str) -> list[str]:
    """The reasons of a ``log_lost`` judgement: what stays unproven and why, cached steps named as such."""
    items = "; ".join(f"`{n}` ({why})" for n, why in list(j.unproven.items())[:3]) + (
        " ..." if len(j.unproven) > 3 else "")
    if j.cause == "cache":
        head = (f"kaniko took the steps of {len(j.unproven)} marker(s) from its cache, so this build never printed "
                f"them, and neither that cache hit nor the image {ref} proves them: {items}")
    else:
        head = f"neither the log nor the image {ref} proves {len(j.unproven)} marker(s): {items}"
    return [head, *j.incomplete]


# ---------------------------------------------------------------------------------------------- run the image
# Where the log cannot prove a marker that the image itself can answer (printed by a `python -c` of a RUN step
# that only tests and prints: the imports a marker reports, Marker.check_step), the service runs that step again
# in the image (activities/build.py: an Iris job whose task image is the pushed digest, a small CPU request, on
# the target's cluster). Its planned build args are defaults under the image's own ENV (Docker: ENV wins).
CHECK_DELIM = "::gpu-rl-builder image check"


def image_check_steps(markers: list[Marker], unproven: dict[str, str]) -> list[str]:
    """The distinct RUN steps whose re-run in the image can prove an unproven marker, in Dockerfile order."""
    steps: list[str] = []
    for m in markers:
        if m.name in unproven and m.check_step and m.step and m.step not in steps:
            steps.append(m.step)
    return steps


def image_check_script(markers: list[Marker], steps: list[str]) -> str:
    """One bash script running each step as `sh -c` would, each in its own subshell, each followed by a
    delimiter line with its exit status."""
    import shlex

    out = ["set +e"]
    for i, step in enumerate(steps):
        env: dict[str, str] = {}
        for m in markers:
            if m.step == step:
                env.update(m.step_env)
        defaults = "".join(f'[ -n "${{{k}+x}}" ] || export {k}={shlex.quote(v)}; ' for k, v in env.items()
                           if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k))
        body = re.sub(r"^RUN\s+", "", step.strip())
        out.append(f"( {defaults}exec sh -c {shlex.quote(body)} ); echo \"{CHECK_DELIM} {i} exit=$?\"")
    return "\n".join(out) + "\n"


class ImageRun(BaseModel):
    """What running the image's own checks showed."""

    ref: str  # repository@digest that ran
    job_id: str = ""
    proven: dict[str, str] = Field(default_factory=dict)  # marker -> how the run proved it
    contradicted: list[str] = Field(default_factory=list)  # the image's own output against the plan
    failed: dict[str, str] = Field(default_factory=dict)  # marker -> why the run did not prove it
    error: str = ""  # the run could not be made or read (then nothing is proven by it)
    asked: list[str] = Field(default_factory=list)  # the markers it was run for


def read_image_run(ref: str, job_id: str, log_text: str, markers: list[Marker], steps: list[str],
                   unproven: dict[str, str]) -> ImageRun:
    """Split the check job's output per step; a marker of a step that exited 0 and printed it is proven; a line
    of another value or an excluded branch contradicts the plan; a failed or silent step proves nothing (a CPU
    task may lack what a GPU import needs: not an assertion on the image)."""
    run = ImageRun(ref=ref, job_id=job_id, asked=[m.name for m in markers if m.name in unproven and m.check_step
                                                  and m.step in steps])
    segments: dict[int, tuple[str, int | None]] = {}
    buf: list[str] = []
    delim = re.compile(re.escape(CHECK_DELIM) + r" (\d+) exit=(\d+)")
    for line in log_text.splitlines():
        hit = delim.search(line)
        if hit:
            segments[int(hit.group(1))] = ("\n".join(buf) + "\n", int(hit.group(2)))
            buf = []
        else:
            buf.append(line)
    for i, step in enumerate(steps):
        ms = [m for m in markers if m.step == step and m.role == "assert"]
        text, code = segments.get(i, ("", None))
        own, numbers = own_output(text)
        for c in _step_contradictions(ms, own, numbers):
            run.contradicted.append(f"running {ref} ({ms[0].source}:{ms[0].line if ms else 0}): {c}")
        for m in ms:
            if m.name not in unproven or not m.check_step:
                continue
            if code is None:
                run.failed[m.name] = f"the image check of {m.source}:{m.line} printed no end line (its log lost it)"
            elif code != 0:
                last = next((x for x in reversed(own.splitlines()) if x.strip()), "")
                run.failed[m.name] = (f"running its step ({m.source}:{m.line}) in {ref} exited {code}"
                                      + (f": {last.strip()[:200]}" if last else ""))
            elif m.search(own):
                run.proven[m.name] = (f"the image ran its own check: {m.source}:{m.line} printed it in {ref} "
                                      f"(Iris job {job_id})")
            else:
                run.failed[m.name] = f"running its step ({m.source}:{m.line}) in {ref} did not print it"
    return run


def _step_contradictions(markers: list[Marker], own: str, numbers: list[int]) -> list[str]:
    from domain.markers import _contradictions

    return _contradictions(markers, own, numbers)


def with_image_run(j: LogJudgement, run: ImageRun) -> LogJudgement:
    """The judgement after the image answered: its contradicting output fails the build; what it proved stands
    in; what stays unproven keeps the target log_lost, with the run's reason."""
    if run.contradicted:
        return j.model_copy(update={"verdict": "contradicted", "contradicted": run.contradicted,
                                    "reasons": list(run.contradicted)})
    unproven = dict(j.unproven)
    stood_in = dict(j.stood_in)
    for name, how in run.proven.items():
        if name in unproven:
            unproven.pop(name)
            stood_in[name] = how
    for name, why in run.failed.items():
        if name in unproven:
            unproven[name] = f"{unproven[name]}; {why}"
    if run.error:
        unproven = {n: (f"{w}; {run.error}" if n in run.asked else w) for n, w in unproven.items()}
    found = [*j.found, *(n for n in run.proven if n not in j.found)]
    if not unproven:
        return j.model_copy(update={"verdict": "image", "missing": [], "unproven": {}, "stood_in": stood_in,
                                    "found": found, "reasons": [], "final_push_seen": True})
    out = j.model_copy(update={"missing": list(unproven), "unproven": unproven, "stood_in": stood_in,
                               "found": found})
    return out.model_copy(update={"reasons": unproven_reasons(out, run.ref)})

