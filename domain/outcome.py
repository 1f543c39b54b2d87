"""Terminal outcomes and waits, as operators see them: failure info, unblocking commands, UI details.

Why pure and in one place: the workflows record these (report, memo, search attributes, the UI's
"Current Details"), the starter prints them, and tests assert on them; each must say the same thing,
and the exact command an operator runs must be spelled once.
"""

from __future__ import annotations

import re
import shlex

from domain.buildset import BuildRequest
from domain.models import (
    ConflictVerdict,
    FailureInfo,
    FailureRecord,
    ForeignHead,
    MergedPins,
    PinnedImage,
    PullRequestInfo,
    RebuildCheckResult,
    RegistryDrift,
    ReviewState,
    Stage,
    TargetBrief,
    WaitingReason,
)
from rehearsal.model import PIN_OVERRIDE

STARTER = "python starter.py"

# Errors that mean "the request or the build contract is wrong": fixing the input is the next step,
# retrying is not (activities raise them non-retryable; see activities/common.input_error).
# PreflightFailed: a credential, permission, tool or the build script is missing or wrong (config key named).
INPUT_ERROR_TYPES = frozenset({"InputError", "ContractError", "BundleError", "SourceError", "BuildSetError",
                               "PreflightFailed"})

# Final failures of the activity error boundary (activities/errors.py): the BuildFailureClass each one
# gets, and what the operator does about it (the message names the credential, file, tool or branch).
BOUNDARY_FAILURES = {
    "AuthenticationFailed": ("credentials", "replace the credential the message names (its source is in the "
                                            "service configuration)"),
    "PermissionDenied": ("permission", "grant the configured credential the permission the message names"),
    "NotFound": ("not_found", "check that what the message names exists and the configured credential can see it"),
    "MissingTool": ("tool", "install the tool on the worker (the worker image pins its tools in "
                            "docker/install.py) or fix the configured command"),
    "Conflict": ("conflict", "look at the branch or work directory the message names; nothing was overwritten"),
    "NotAuthorized": ("authorization", "have a configured operator ([operators] in the worker's configuration) "
                                       "run the command"),
    "Transient": ("unreachable", "the service stayed unreachable for the whole retry budget; once it answers, "
                                 "build again (nothing already done is repeated)"),
    "PreflightUnavailable": ("unreachable", "the service the preflight names (Iris, the registry or GitHub) stayed "
                                            "unreachable for the whole retry budget; once it answers, build again"),
}

# ``path/to/file.ext:12`` as the contract parsers and input errors write it (ContractError); an
# address such as ``127.0.0.1:8233`` has no alphabetic extension and is not taken for a location.
_LOCATION = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w.-]*?[A-Za-z][\w-]*\.[A-Za-z][\w-]*):(\d+)\b")


def find_location(message: str) -> str | None:
    """The first ``file:line`` an error message names, if any."""
    m = _LOCATION.search(message or "")
    return f"{m.group(1)}:{m.group(2)}" if m else None


def q(arg: str) -> str:
    return shlex.quote(arg)


def decide_command(workflow_id: str, key: str, action: str = "retry") -> str:
    return f"{STARTER} decide {q(workflow_id)} {q(key)} {action} --by <your-name>"


def recheck_command(workflow_id: str, key: str) -> str:
    return f"{STARTER} recheck {q(workflow_id)} {q(key)}"


# The BuildFailureClass a target shows while a re-check can end its wait (workflows/target.py: a private
# package, an inconclusive or unreachable registry). Any other wait, or none, has nothing to re-check.
RECHECK_WAITS = frozenset({"visibility", "validation_inconclusive"})


def recheck_refusal(workflow_id: str, key: str, *, running: bool, status: str, stage: str | None,
                    failure_class: str | None) -> str | None:
    """Why ``recheck`` cannot help ``key`` now (None: it can), read from the target's own state (its
    execution status and search attributes: no worker needed), with what to do instead."""
    if not running:
        return (f"{key} has already finished ({status}{f', stage {stage}' if stage else ''}); nothing to re-check "
                f"(`{STARTER} report {q(workflow_id)}`)")
    if stage == Stage.WAITING.value and failure_class in RECHECK_WAITS:
        return None
    if stage == Stage.WAITING.value:
        return (f"{key} is not waiting for package visibility or the registry but for an operator decision "
                f"({failure_class or 'unknown'} failure); nothing sent — run `{decide_command(workflow_id, key)}` "
                f"or `{decide_command(workflow_id, key, 'abort')}`")
    return (f"{key} is not waiting for a re-check (stage {stage or 'unknown'}); nothing sent — a re-check "
            f"applies while it waits for package visibility or the registry (`{STARTER} follow {q(workflow_id)}` "
            "shows when)")


def resume_command(workflow_id: str) -> str:
    """Run the failed build again as it was requested: every target already validated is adopted."""
    return f"{STARTER} resume {q(workflow_id)}"


def approve_command(workflow_id: str) -> str:
    return f"{STARTER} approve-merge {q(workflow_id)} --by <your-name>"


def build_command(request: BuildRequest, plan: bool = False) -> str:
    """The ``build`` command that makes this request again (to run after fixing its input), with the
    operator's own flags: ``--plan`` too when the failed request was a plan."""
    parts = [f"{STARTER} build"]
    parts += [f"--arch {q(a)}" for a in request.architectures]
    parts += [f"--variant {q(v)}" for v in request.variants]
    parts += [f"--cluster {q(f'{a}={c}')}" for a, c in sorted(request.clusters.items())]
    cr = request.compatibility_request
    if cr:
        parts += [f"--requested-by {q(cr.requested_by)}", f"--reason {q(cr.reason)}"]
        if cr.link:
            parts.append(f"--link {q(cr.link)}")
    if request.priority:
        parts.append(f"--priority {q(request.priority)}")
    if request.harbor_ref:
        parts.append(f"--harbor-ref {q(request.harbor_ref)}")
    if request.push_floating:
        parts.append("--push-floating")
    if request.issue_url:
        parts.append(f"--issue-url {q(request.issue_url)}")
    if plan:
        parts.append("--plan")
    return " ".join(parts)


_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)")


_PARSER = re.compile(r"the parser \(([\w/.]+)\) needs attention")
_SUGGESTED = re.compile(r"\(pass: ((?:--cluster [\w.-]+=[\w.-]+ ?)+)\)")
_SUGGESTED_CLUSTER = re.compile(r"--cluster ([\w.-]+)=([\w.-]+)")
_CONFIG_KEY = re.compile(r"config(?:uration)?[: ]\[?((?:[a-z0-9_]+\.)+[a-z0-9_]+)\]?")


def input_failure(error_type: str, message: str, request: BuildRequest, *, plan: bool = False) -> FailureInfo:
    """The next step says where the fix belongs: the upstream file, the service configuration, the
    operator's flag, or the service's parser (an issue to file; the upstream file is probably fine)."""
    loc = find_location(message)
    flag = _FLAG.search(message)
    suggested = _SUGGESTED.search(message)
    if suggested:  # the refusal names the flags that fix it (activities/source.cluster_suggestion): run them
        clusters = dict(_SUGGESTED_CLUSTER.findall(suggested.group(1)))
        request = request.model_copy(update={"clusters": {**request.clusters, **clusters}})
    again = f"then run `{build_command(request, plan)}`"
    parser = _PARSER.search(message)
    config = _CONFIG_KEY.search(message)
    if parser:
        step = (f"the upstream file is probably fine: gpu-rl-builder's parser ({parser.group(1)}) cannot read "
                f"{f'`{loc}`' if loc else 'it'} yet — file an issue against gpu-rl-builder quoting this message "
                f"(or build a commit it reads); {again}")
    elif "rehearsal" in message and PIN_OVERRIDE in message:
        step = ("the script overrides a Dockerfile pin with --build-arg (the image would bake another value than "
                "the PR records): drop the override from the script, or change the pin in the Dockerfile and commit "
                f"it, in the MarinSkyRL repository; {again}")
    elif "rehearsal" in message and "the script asked kaniko for" in message:
        step = ("the plan and what the script asks kaniko for differ: if the script is right, the service "
                "misread it — file an issue against gpu-rl-builder (domain/contract/script.py) quoting this "
                f"message; if the plan is right, fix the script in the MarinSkyRL repository; {again}")
    elif loc and not loc.startswith("config"):
        step = f"fix `{loc}` in the MarinSkyRL repository (the upstream file at the cited commit), commit it; {again}"
    elif config and not flag:
        step = f"fix the service configuration `{config.group(1)}` (GPU_RL_BUILDER_CONFIG / --config); {again}"
    elif flag:
        step = f"fix `{flag.group(1)}`, {again}"
    elif "architecture" in message:
        step = f"fix `--arch`, {again}"
    else:
        step = f"fix the file, field or flag named above, {again}"
    return FailureInfo(failure_class="input", error_type=error_type, message=message, location=loc, next_step=step)


def step_failure_class(error_type: str) -> str:
    """The failure class of a step that ended with ``error_type`` (an ActivityFailure class name)."""
    if error_type in INPUT_ERROR_TYPES:
        return "input"
    if error_type in BOUNDARY_FAILURES:
        return BOUNDARY_FAILURES[error_type][0]
    if error_type in ("ActivityTimeout", "StartToCloseTimeout", "HeartbeatTimeout", "ScheduleToCloseTimeout"):
        return "timeout"
    return "internal"


def target_step_failure(key: str, step: str, error_type: str, message: str, job_ids: list[str]) -> FailureRecord:
    """A target's step (activity) failed for good: the failure keeps the target's jobs and the step's own
    error, instead of the bare "child workflow failed: Activity task failed" (issue #17)."""
    failure_class = step_failure_class(error_type)
    what_to_do = BOUNDARY_FAILURES.get(error_type, ("", "fix the cause the message names"))[1]
    jobs = ", ".join(job_ids) or "none submitted"
    return FailureRecord(
        job_id=job_ids[-1] if job_ids else "-", failure_class=failure_class, decision="fail",
        reasons=[f"step {step} failed ({error_type}): {message}", f"Iris jobs: {jobs}"],
        hint=f"{what_to_do}, then build again")


def step_failure(error_type: str, message: str, *, step: str, request: BuildRequest,
                 resume_id: str | None = None, plan: bool = False) -> FailureInfo:
    """A pipeline step (load, prepare, plan, record, merge) ended with an error.

    ``resume_id``: the step came after every target was validated (recording, the PR, the merge); the
    next step is then to resume that build, which adopts the validated images — never a rebuild.
    ``plan``: the request was a plan (`build --plan`): the suggested command repeats it."""
    again = (f"`{resume_command(resume_id)}` (the validated images are adopted, nothing is rebuilt)"
             if resume_id else f"`{build_command(request, plan)}`")
    if error_type in INPUT_ERROR_TYPES and not resume_id:
        return input_failure(error_type, message, request, plan=plan)
    if error_type in INPUT_ERROR_TYPES:
        return FailureInfo(failure_class="input", error_type=error_type, message=f"{step}: {message}",
                           location=find_location(message), next_step=f"fix what the message names; then run {again}")
    if error_type in BOUNDARY_FAILURES:
        failure_class, what_to_do = BOUNDARY_FAILURES[error_type]
        if resume_id and error_type == "Transient":
            what_to_do = "the service stayed unreachable for the whole retry budget; once it answers"
        return FailureInfo(failure_class=failure_class, error_type=error_type, message=f"{step}: {message}",
                           location=find_location(message),
                           next_step=f"{what_to_do}; then run {again}")
    if error_type in ("ActivityTimeout", "StartToCloseTimeout", "HeartbeatTimeout", "ScheduleToCloseTimeout"):
        failure_class = "timeout"
    else:
        failure_class = "internal"
    return FailureInfo(
        failure_class=failure_class, error_type=error_type, message=f"{step}: {message}",
        location=find_location(message),
        next_step=f"look at the failed `{step}` event in the workflow's history (Temporal UI), fix the cause, "
                  f"then run {again}")


def targets_failure(messages: list[str], failure_classes: list[str], request: BuildRequest,
                    workflow_id: str | None = None) -> FailureInfo:
    """One or more targets failed: their messages already carry evidence and next step. The re-run
    (same commits, same workflow id) adopts the targets that did validate and rebuilds only the rest. A lost
    log offers the same command its target does (``resume``), so the report never names two."""
    again = build_command(request)
    if workflow_id and failure_classes and all(c in ("log_lost", "cache_unproven") for c in failure_classes):
        again = resume_command(workflow_id)
    return FailureInfo(
        failure_class=failure_classes[0] if failure_classes else "unknown", error_type="BuildFailed",
        message=" | ".join(messages), location=next((loc for m in messages if (loc := find_location(m))), None),
        next_step=f"follow the failing target's next step above; then run `{again}` "
                  "(targets already validated are adopted, not rebuilt)")


def cancelled(request: BuildRequest) -> FailureInfo:
    return FailureInfo(failure_class="cancelled", error_type="Cancelled",
                       message="cancelled by an operator; the build's own Iris jobs were terminated",
                       next_step=f"nothing to clean up; to build again run `{build_command(request)}`")


# ----------------------------------------------------------------------------- done by someone else
# Ways a build ends because someone outside the service ended what it waited for: they read as cancelled
# (a person's decision, not an error), and the Temporal run fails so that `resume` may run it again.
CLOSED_OUTSIDE_CLASSES = frozenset({"pr_closed", "branch_deleted", "merged_other_head", "superseded"})


def is_cancelled(failure: FailureInfo | None) -> bool:
    return failure is not None and (failure.failure_class == "cancelled"
                                    or failure.failure_class in CLOSED_OUTSIDE_CLASSES)


def _by(login: str | None, at: str | None = None) -> str:
    return (f" by {login}" if login else "") + (f" at {at}" if at else "")


def closed_outside(rev: ReviewState, pr: PullRequestInfo, workflow_id: str) -> FailureInfo:
    """The PR was closed unmerged, or its head (the build branch) deleted, by someone on GitHub while the
    build waited for the merge. What an operator expects: the build stops at once saying who and when
    (GitHub's ``closed_by``), merges nothing, and says how to take it up again if that was a mistake —
    ``resume`` adopts the validated images (nothing is rebuilt), pushes the build branch again if it is
    gone, and waits on the re-opened PR (or opens a new one)."""
    resume = f"`{resume_command(workflow_id)}`"
    keep = "otherwise nothing to clean up: the validated images stay in the registry, unpinned"
    if rev.branch_deleted:
        branch = rev.head_ref or "the build branch"
        return FailureInfo(
            failure_class="branch_deleted", error_type="BranchDeleted",
            message=f"the build branch {branch} was deleted on GitHub outside the service, so GitHub closed "
                    f"PR #{pr.number} unmerged{_by(rev.closed_by, rev.closed_at)}; nothing was merged",
            next_step=f"if it should merge: run {resume} — it pushes {branch} again (the same commits), adopts "
                      f"the validated images (nothing is rebuilt) and opens a PR again; {keep}")
    return FailureInfo(
        failure_class="pr_closed", error_type="PullRequestClosed",
        message=f"PR #{pr.number} ({pr.url}) was closed unmerged on GitHub{_by(rev.closed_by, rev.closed_at)}, "
                "outside the service; nothing was merged",
        next_step=f"if it should merge: re-open PR #{pr.number} on GitHub, then run {resume} (the validated "
                  f"images are adopted, nothing is rebuilt, and the build waits on the re-opened PR); {keep}")


def merged_outside_message(pr: PullRequestInfo, rev: ReviewState) -> str:
    """A PR merged by a person on GitHub (not by the service): the build is done, recording the merge and
    what the merged pin table was read to hold (never claimed unread)."""
    base = (f"PR #{pr.number} was merged on GitHub{_by(rev.merged_by)}, outside the service, as "
            f"{rev.merge_commit or 'an unreported merge commit'}")
    return f"{base}; {merged_pins_text(rev.merged_pins)}"


def merged_pins_text(pins: MergedPins | None) -> str:
    if pins is None:
        return "the pin table it merged was not read (unchecked)"
    if pins.unreadable:
        return f"the pin table it merged could not be read ({pins.unreadable}): unchecked"
    where = f"{pins.path} at {pins.commit[:12]}"
    if pins.holds_validated:
        return f"the pin table it merged ({where}, read after the merge) holds the validated digests"
    return f"the pin table it merged ({where}) does not hold the validated digests: {'; '.join(pins.differences)}"


def merged_other_head(rev: ReviewState, pr: PullRequestInfo, request: BuildRequest) -> FailureInfo:
    """Someone merged the PR by hand while its head was not this build's pin commit, and the merged pin table
    does not hold the validated digests: nothing of this build is pinned on main. Ends like the other
    outside ends (a person's decision), saying exactly what main pins now."""
    head = rev.foreign_head
    moved = (f" at head {head.sha[:12]} ({head.how or 'pushed'}{_by(head.pushed_by, head.pushed_at)}), not the pin "
             f"commit {head.pin_commit[:12]} this build pushed") if head else ""
    pins = rev.merged_pins
    path = pins.path if pins else "the pin table"
    return FailureInfo(
        failure_class="merged_other_head", error_type="MergedOtherHead",
        message=f"{merged_outside_message(pr, rev)}{moved}; main does not pin this build's validated images",
        next_step=f"read what main pins now (`git show {rev.merge_commit or 'MERGE_COMMIT'}:{path}`); to pin the "
                  f"validated images listed in this report, run `{build_command(request)}` (validated targets "
                  "are adopted, not rebuilt) and approve its PR")


def superseded(verdict: ConflictVerdict, pr: PullRequestInfo) -> FailureInfo:
    """The PR cannot merge because main already pins images of the same or a newer source: merging this build
    would overwrite newer pins with older ones, so it ends, naming the build that superseded it."""
    return FailureInfo(
        failure_class="superseded", error_type="Superseded",
        message=f"superseded by {verdict.superseded_by}: PR #{pr.number} conflicts with main and {verdict.detail}; "
                "nothing was merged (main's pins stay)",
        next_step=f"nothing to do: main pins the newer images; PR #{pr.number} ({pr.url}), which cannot merge, was "
                  "closed by the service with a comment saying why")


def conflict_waiting(verdict: ConflictVerdict | None, rev: ReviewState, pr: PullRequestInfo, workflow_id: str,
                     request: BuildRequest) -> WaitingReason:
    """Why the PR cannot merge and the next step: GitHub's refusal, and how main's new commits were judged
    (a rebase the service did itself never waits here: it waits for checks and a new approval)."""
    said = f" ({rev.merge_refused})" if rev.merge_refused else ""
    main = f" ({rev.base_sha[:12]})" if rev.base_sha else ""
    cancel = f"`{STARTER} cancel {q(workflow_id)}`"
    if verdict is None:
        return WaitingReason(kind="merge_conflict", detail=(
            f"PR #{pr.number} ({pr.url}) cannot merge: GitHub reports conflicts with main{main}{said}; the service "
            f"judges main's new commits next. If it stays: {cancel}, then build from the new main"),
            command=build_command(request))
    why = "; ".join(verdict.reasons[:5])
    return WaitingReason(kind="merge_conflict", detail=(
        f"PR #{pr.number} ({pr.url}) cannot merge{said}: {verdict.detail}"
        + (f" [{why}]" if why and why not in verdict.detail else "")
        + f". Next step: {cancel}, then build from the new main (the command)"), command=build_command(request))


def restore_head_command(repo_url: str, branch: str, pin_commit: str, theirs: str) -> str:
    """Puts the pin commit back on the build branch, only while the branch is still at ``theirs`` (a lease:
    a later push by anyone is never overwritten). Runs in any clone; the fetch brings the pin commit."""
    url = shlex.quote(repo_url)
    return (f"git fetch {url} {pin_commit} && git push --force-with-lease=refs/heads/{branch}:{theirs} {url} "
            f"{pin_commit}:refs/heads/{branch}")


def head_moved_blocking(head: ForeignHead) -> str:
    """The merge gate's words for a build branch someone else moved (one clause, no override merges it)."""
    who = f"{head.how or 'pushed'}{_by(head.pushed_by, head.pushed_at)}" if head.pushed_by or head.pushed_at else (
        "pushed by someone GitHub's repository activity does not name")
    return (f"the PR head is {head.sha[:12]}, not the pin commit {head.pin_commit[:12]} this build pushed "
            f"({who})")


def head_moved_waiting(head: ForeignHead, pr: PullRequestInfo, workflow_id: str) -> WaitingReason:
    """Why the merge is held and how to release it. Why hold: the service merges only the head it pushed
    (the pin commit holding the validated digests); another head's tree was never validated, so no
    approval or override merges it. Restoring the branch (the command) releases the hold; an approval given
    for the other head does not carry over (approve again once restored)."""
    detail = (f"merge of PR #{pr.number} held: {head_moved_blocking(head)}; only the pin commit is merged. To "
              f"merge: restore {head.branch} to {head.pin_commit[:12]} (the command), then approve again "
              f"(`{approve_command(workflow_id)}`). If the new commits were meant: `{STARTER} cancel "
              f"{q(workflow_id)}`, then build them")
    return WaitingReason(kind="head_moved", detail=detail, command=head.restore_command or None)


def pinned_images(targets) -> list[PinnedImage]:
    """What the PR pins: each validated target's repository, tag and digest."""
    return [PinnedImage(key=t.key, image_repository=t.image_ref.rpartition(":")[0] if t.image_ref else "",
                        tag=t.tag, digest=t.digest) for t in targets if t.status == "validated" and t.digest]


def registry_drift(image: PinnedImage, *, at_tag: str | None, anonymous: bool | None,
                   anonymous_detail: str = "") -> RegistryDrift | None:
    """How the registry differs from what was validated: the tag gone (``at_tag`` None) or moved to another
    digest, or the image no longer anonymously pullable (``anonymous`` False; None = not known)."""
    ref = f"{image.image_repository}:{image.tag}"
    if at_tag is None:
        return RegistryDrift(key=image.key, image=ref, validated=image.digest, kind="gone",
                             detail=f"{ref} no longer exists (the tag was deleted)")
    if at_tag != image.digest:
        return RegistryDrift(key=image.key, image=ref, validated=image.digest, kind="moved", now=at_tag,
                             detail=f"{ref} now points at {at_tag}, not the validated {image.digest}")
    if anonymous is False:
        return RegistryDrift(key=image.key, image=ref, validated=image.digest, kind="private",
                             detail=f"{ref} is no longer anonymously pullable ({anonymous_detail or 'private'})")
    return None


def drift_class(drift: list[RegistryDrift]) -> str | None:
    """BuildFailureClass while the merge is held: ``tag_moved`` (moved or deleted), else ``visibility``."""
    if not drift:
        return None
    return "tag_moved" if any(d.kind in ("moved", "gone") for d in drift) else "visibility"


def drift_blocking(drift: list[RegistryDrift]) -> str:
    """The merge gate's words for it (one clause, joined with the other blockers)."""
    return "; ".join(f"registry changed since validation: {d.detail}" for d in drift)


def drift_waiting(drift: list[RegistryDrift], pr: PullRequestInfo, workflow_id: str) -> WaitingReason:
    """Why the merge is held and what unblocks it. Why hold rather than merge: the pin table names each
    image by tag and digest; a tag moved (or deleted) by someone else would be merged as a lie about what
    that tag serves, and an image no longer public breaks everyone who pulls the pin. The PR still pins
    the validated digest. Why hold rather than end: restoring the tag (or the visibility) is one command,
    after which the merge proceeds by itself; a move that was meant needs a rebuild, which ``resume``
    after ``cancel`` does (the moved target is no longer adopted)."""
    restore = [f"skopeo copy --all docker://{d.image.rpartition(':')[0]}@{d.validated} docker://{d.image}"
               for d in drift if d.kind in ("moved", "gone")]
    private = sorted({d.image.rpartition(":")[0] for d in drift if d.kind == "private"})
    fixes = (["restore the tag (the command)"] if restore else []) + [
        f"make {repo} public again (GitHub → Packages → Package settings → Change visibility → Public)"
        for repo in private]
    detail = (f"merge of PR #{pr.number} held: {'; '.join(d.detail for d in drift)}; the PR still pins the "
              f"validated digest(s). To merge: {'; '.join(fixes)} — the merge then proceeds by itself. "
              f"If the change was meant: `{STARTER} cancel {q(workflow_id)}`, then `{resume_command(workflow_id)}` "
              "rebuilds the changed target(s)")
    return WaitingReason(kind="registry_drift", detail=detail, command=" && ".join(restore) or None)


def drift_markdown(drift: list[RegistryDrift]) -> list[str]:
    """The PR (body or comment) section about it: what changed, and that the pin is the validated digest."""
    if not drift:
        return []
    out = ["**Registry changed since validation** (by someone outside the service). This PR pins the validated "
           "digests; the merge is held until the registry serves them as validated again:", ""]
    out += [f"- {d.key}: {d.detail}" for d in drift]
    return out


def waiting_line(w: WaitingReason) -> str:
    """One line: what is awaited and the command that unblocks it."""
    who = f"{w.target}: " if w.target else ""
    return f"{who}{w.detail}" + (f" — run `{w.command}`" if w.command else "")


def details_markdown(*, title: str, stage: Stage, targets: list[TargetBrief] | None = None,
                     waiting: list[WaitingReason] | None = None, failure: FailureInfo | None = None,
                     note: str = "", digests: dict[str, str] | None = None,
                     pull_request: PullRequestInfo | None = None) -> str:
    """The short Markdown status shown as the workflow's Current Details in the Temporal UI.

    ``digests`` (target key → validated image digest) add a digest column; ``pull_request`` a line
    with the PR and, once merged, its merge commit: what a merged build produced, without opening JSON."""
    out = [f"**{title}** — stage **{stage.value}**"]
    if note:
        out.append(note)
    if pull_request:
        merged = (f" — merged as `{pull_request.merge_commit}`" if pull_request.merge_commit
                  else " — merged" if pull_request.merged else "")
        if pull_request.merged and pull_request.merged_by:
            merged += f" by {pull_request.merged_by}"
        out += ["", f"**PR** [#{pull_request.number}]({pull_request.url}){merged}"]
    if targets:
        digest_col = bool(digests)
        out += ["", "| target | stage | job | failure class |" + (" digest |" if digest_col else ""),
                "|---|---|---|---|" + ("---|" if digest_col else "")]
        out += [f"| {t.key} | {t.stage.value} | {t.job_id or '-'} | {t.failure_class or '-'} |"
                + (f" `{(digests or {}).get(t.key) or '-'}` |" if digest_col else "") for t in targets]
    for w in waiting or []:
        out += ["", f"**Waiting** — {waiting_line(w)}"]
    if failure:
        out += ["", f"**{'Cancelled' if is_cancelled(failure) else 'Failed'}** "
                    f"({failure.failure_class}, {failure.error_type}"
                    + (f", `{failure.location}`" if failure.location else "") + f"): {failure.message}",
                "", f"**Next step:** {failure.next_step}"]
    return "\n".join(out)


# ----------------------------------------------------------------------------- rebuild checks
def rebuild_decision(result: RebuildCheckResult) -> str:
    """One line: the rebuild check's decision, what it did, and why (for report, schedules, the UI)."""
    d = result.decision
    head = "rebuild" if d.needed else "no rebuild"
    did = result.note or ("started " + result.pipeline_workflow_id if result.started and result.pipeline_workflow_id
                          else "")
    # The deciding reason first (the check orders them so), then what it did, then the rest: a listing that
    # wraps or cuts the line still shows why.
    first, rest = (d.reasons[0], "; ".join(d.reasons[1:4]) + (f" (and {len(d.reasons) - 4} more)"
                                                               if len(d.reasons) > 4 else "")) if d.reasons else ("", "")
    return " — ".join(x for x in (head, first, did, rest) if x)


def rebuild_details_markdown(result: RebuildCheckResult | None = None, *, error: str = "") -> str:
    """The rebuild check's Current Details: checking, its decision with reasons and commits, or its failure."""
    title = "**Rebuild check**"
    if error:
        return "\n".join([f"{title} — **failed**", "", error, "",
                          "**Next step:** fix the cause named above; the schedule checks again at its next time "
                          f"(or run `{STARTER} schedule trigger <schedule-id>`)"])
    if result is None:
        return f"{title} — checking: comparing the latest default branches with the last validated image's commits"
    d = result.decision
    out = [f"{title} — decision **{'rebuild' if d.needed else 'no rebuild'}**", ""]
    if result.note:
        out.append(result.note)
    out += ["", "| | latest | last validated image |", "|---|---|---|",
            f"| source | `{d.source_commit[:12]}` | `{(d.last_source_commit or '-')[:12]}` |",
            f"| harbor | `{d.harbor_commit[:12]}` | `{(d.last_harbor_commit or '-')[:12]}` |"]
    if d.reasons:
        out += ["", "**Why:**", *[f"- {r}" for r in d.reasons]]
    if d.changed_paths:
        shown = ", ".join(f"`{p}`" for p in d.changed_paths[:20])
        more = f" and {len(d.changed_paths) - 20} more" if len(d.changed_paths) > 20 else ""
        out += ["", f"**Changed paths** ({len(d.changed_paths)}): {shown}{more}"]
    if result.pipeline_workflow_id:
        wid = result.pipeline_workflow_id
        out += ["", f"**Pipeline:** `{wid}` — " + (f"follow it: `{STARTER} follow {q(wid)}`" if result.started
                                                   else "not started by this check")]
    return "\n".join(out)
