"""The operators' troubleshooting page (docs/troubleshooting.md): every failure class, wait and stage
the service reports, what it means, whether the service retries it, and the exact next step.

Why here and generated: the classes live in code (domain/failures.py, domain/outcome.py, the
workflows); the page takes the retry behaviour from ``decide_retry`` and the default budget, the
hints from ``failures.HINTS``, the boundary next steps from ``outcome.BOUNDARY_FAILURES`` and the
commands from ``outcome``'s command builders, so it says what the code does. A class, wait kind or
stage without an entry fails tests/docs/test_reference_docs.py.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from domain import failures, outcome
from domain.config import PolicySettings
from domain.models import Stage, WaitingReason

WID, TARGET = "WID", "TARGET"


def _cmd(text: str) -> str:
    """A command from outcome's builders, with placeholders for the workflow id and target."""
    return f"`{text.replace(WID, '<workflow-id>').replace(TARGET, '<target>')}`"


DECIDE_RETRY = _cmd(outcome.decide_command(WID, TARGET, "retry"))
DECIDE_ABORT = _cmd(outcome.decide_command(WID, TARGET, "abort"))
RECHECK = _cmd(outcome.recheck_command(WID, TARGET))
RESUME = _cmd(outcome.resume_command(WID))
APPROVE = _cmd(outcome.approve_command(WID))
LOGS = f"`{outcome.STARTER} logs <workflow-id> <target>`"
REPORT = f"`{outcome.STARTER} report <workflow-id>`"
BUILD_AGAIN = "the `build` command the report's next step prints"


@dataclass(frozen=True)
class Entry:
    name: str
    meaning: str
    next_step: str
    retried: str = ""  # what the service does by itself, if anything


def _retry_text(cls: failures.FailureClass) -> str:
    """What ``decide_retry`` does with a first failure of ``cls`` under the default budget."""
    budget = PolicySettings().retry_budget
    c = failures.Classification(failure_class=cls, reasons=[], retryable_by_default=cls in failures.RETRYABLE,
                                operator_hint="")
    match failures.decide_retry(c, {}, budget):
        case "retry" if cls is failures.FailureClass.CONTROLLER_BLIP:
            return "not a failure: the job is observed again, no budget used"
        case "retry":
            return (f"resubmitted automatically up to {budget[str(cls)]} times (`policy.retry_budget.{cls}`); "
                    "then the target fails")
        case "ask_operator":
            return "the target waits for an operator's decision (`operator_decision` below)"
        case _:
            return "never retried: the target fails at once"


# Target failure classes (domain/failures.py): the job's own outcome, classified from Iris, Kubernetes
# and the log. The hint is the one reports and `follow` show.
_TARGET_NEXT = {
    failures.FailureClass.PREEMPTION: f"nothing while the budget lasts; after it, build again (the cache is kept) "
                                      f"or {RESUME}",
    failures.FailureClass.WORKER_LOSS: f"nothing while the budget lasts; after it, read the captured pod events "
                                       f"({LOGS}), then {RESUME}",
    failures.FailureClass.OOM: f"raise the job's memory (`build.architectures.<arch>.memory` or the ops doc), run "
                               f"{DECIDE_ABORT}, then build again; {DECIDE_RETRY} only if the cause was passing",
    failures.FailureClass.REGISTRY_TRANSIENT: f"nothing while the budget lasts; after it, check the registry, "
                                              f"then {RESUME}",
    failures.FailureClass.INPUT_ERROR: f"read the failing line ({LOGS}), fix the variable, pin, wheel or MANIFEST "
                                       f"it names in MarinSkyRL at the build commit, then run {BUILD_AGAIN}",
    failures.FailureClass.ASSERTION_FAILURE: f"read the failing step ({LOGS}); fix the pins or extras upstream, "
                                             f"then run {BUILD_AGAIN}",
    failures.FailureClass.TIMEOUT: f"a job: check its last marker in {LOGS}; if it was still progressing raise "
                                   f"`build.architectures.<arch>.timeout_s` (or the ops doc's), then "
                                   f"{DECIDE_ABORT} and build again, else {DECIDE_RETRY}. A service step: read the "
                                   f"failed step's event in the history (Temporal UI), then {RESUME}",
    failures.FailureClass.UNSCHEDULABLE: f"compare the request (cpu, memory, gpu, architecture) with the cluster's "
                                         f"capacity and queue; {DECIDE_RETRY} once capacity is there, or "
                                         f"{DECIDE_ABORT}",
    failures.FailureClass.CONTROLLER_BLIP: "nothing; if `follow` keeps showing `controller unreachable`, check the "
                                           "cluster's `controller_url` or port-forward (`kubeconfig`, `kube_context`)",
    failures.FailureClass.LOG_LOST: f"read the reasons ({REPORT}): they name the image at the tag and what it "
                                    f"could not prove. An image that is not ours or not there: nothing was pushed, "
                                    f"run {RESUME}. Otherwise check the image by hand, then {RESUME} (kaniko reuses "
                                    f"its cache); if logs keep losing lines, tell the cluster operators",
    failures.FailureClass.CACHE_UNPROVEN: f"read the reasons ({REPORT}): each names a marker's cached step "
                                          f"(`file:line`) and why the hit cannot prove it. A {RESUME} reusing the "
                                          f"cache proves nothing more: set `KANIKO_CACHE = \"0\"` (the build "
                                          f"script's cache switch) in `clusters.<name>.job_env` for the target's "
                                          f"cluster, restart the worker, run {RESUME}, then remove it",
    failures.FailureClass.UNKNOWN: f"read the log and the evidence ({LOGS}, "
                                   f"`{outcome.STARTER} evidence <workflow-id>`), then {DECIDE_RETRY} or "
                                   f"{DECIDE_ABORT}",
}
_TARGET_MEANING = {
    failures.FailureClass.LOG_LOST: "The job succeeded, but its log lost lines (an Iris worker's log client keeps "
                                    "at most 10,000 unsent lines and drops the oldest, leaving no `seq` gap) and "
                                    "the image at the tag could not prove the missing markers (not our labels, no "
                                    "such image, a marker that carries a value or is printed on a branch: only its "
                                    "own line proves those, or no history step that is its RUN instruction). A "
                                    "missing line alone is never an `assertion_failure`; a line of the build's own "
                                    "output against the plan is.",
    failures.FailureClass.CACHE_UNPROVEN: "The job succeeded and pushed our image, but kaniko took marker steps "
                                          "from its layer cache (`Using caching version of cmd: RUN …`), so this "
                                          "build never printed their lines. A cache hit means the very step ran "
                                          "before on the same inputs and exited 0 (kaniko's cache key holds the "
                                          "step, its parent layers and the build args and ENV in force): that "
                                          "proves a fixed line the step always prints, and a value that is a "
                                          "keyed build arg, never a branch, a value the step computes, or a line "
                                          "the step can skip. Those stay unproven; the class says the cache, not "
                                          "the log store, is why (a rebuild after a cancel or a late failure).",
    failures.FailureClass.TIMEOUT: "The job's per-task timeout expired (Iris: `Execution timeout exceeded`); "
                                   "also the class of a service step that exceeded its Temporal timeout.",
}


def _boundary(error_type: str, meaning: str, then: str) -> Entry:
    failure_class, what_to_do = outcome.BOUNDARY_FAILURES[error_type]
    return Entry(failure_class, f"{meaning} (`{error_type}`).", f"{what_to_do}; then {then}",
                 "never retried: stopped at once" if failure_class != "unreachable" else
                 "retried with backoff for the step's budget (about 30 minutes; 2 hours for the merge wait)")


_AGAIN = f"{RESUME} (validated targets are adopted) or {BUILD_AGAIN}"

# Failure classes of the pipeline and of a target's own steps and waits (domain/outcome.py, the workflows).
SERVICE_CLASSES = [
    Entry("input", "The request or the build contract was refused before anything was submitted: a flag, a "
                   "configuration key, or a file at the build commit (`InputError`, `ContractError`, ...). "
                   "Exit code 2.",
          f"the next step names the `file:line`, configuration key or flag: fix it, then run {BUILD_AGAIN}",
          "never retried"),
    _boundary("AuthenticationFailed", "A credential was refused", _AGAIN),
    _boundary("PermissionDenied", "A credential lacks a permission", _AGAIN),
    _boundary("NotFound", "A repository, branch, package or file the step needs does not exist or is not "
                          "visible to the credential", _AGAIN),
    _boundary("MissingTool", "An executable the worker runs is missing", _AGAIN),
    _boundary("Conflict", "A branch or work directory holds something else", _AGAIN),
    _boundary("NotAuthorized", "The caller of an operator command is not a configured operator",
              "run the command again"),
    _boundary("Transient", "A service (Iris, the registry, GitHub, git) stayed unreachable for the whole retry "
                           "budget; exit code 3", _AGAIN),
    Entry("internal", "A step failed with an error the service does not classify (an unexpected answer or a "
                      "bug).",
          f"read the failed step's event in the workflow's history (Temporal UI); fix the cause, then {_AGAIN}",
          "retried by the step's retry policy first (bounded); this is its final error"),
    Entry("cancelled", "An operator cancelled the build; its own Iris jobs were terminated (exact ids, nothing "
                       "else).", f"nothing to clean up; to build again run {BUILD_AGAIN}"),
    Entry("terminated", "The workflow was terminated outside the service (e.g. `temporal workflow terminate`).",
          RESUME),
    Entry("timed_out", "The workflow hit a Temporal execution timeout set outside the service.", RESUME),
    Entry("visibility", "The image is built and valid but its package is private (the anonymous-pull gate); "
                        "the target waits, it is never rebuilt. Also while a PR waits for its merge: someone "
                        "made a pinned package private after validation; the merge is held (`registry_drift`).",
          f"make the package public (GitHub → Packages → Package settings → Change visibility → Public), then "
          f"{RECHECK} (a held merge proceeds by itself)",
          "validated again every `policy.visibility_recheck_interval_s`; a held merge re-checks every "
          "`policy.merge_watch_registry_interval_s`"),
    Entry("pr_closed", "Someone closed the build's PR unmerged on GitHub while it waited for the merge; the build "
                       "ended cancelled (the report names who and when); nothing was merged.",
          f"if it should merge: re-open the PR on GitHub, then {RESUME} (validated images adopted, nothing "
          "rebuilt); otherwise nothing to clean up"),
    Entry("branch_deleted", "Someone deleted the build branch on GitHub (which closes its PR) while the build "
                            "waited for the merge; the build ended cancelled; nothing was merged.",
          f"if it should merge: {RESUME} (pushes the branch again, adopts the validated images, opens a PR "
          "again); otherwise nothing to clean up"),
    Entry("merged_other_head", "Someone merged the build's PR by hand while its head was not the build's pin "
                                "commit, and the pin table it merged (read from the merge commit) does not hold the "
                                "validated digests: the build ended cancelled; nothing of it is pinned on main.",
          f"read what main pins (`git show <merge-commit>:<pin table>`); to pin the validated images, {BUILD_AGAIN} "
          "(validated targets are adopted) and approve its PR"),
    Entry("superseded", "The build's PR conflicted with main, and main already pins images built from the same "
                        "or a newer source (the report names the build that pinned them): merging would overwrite "
                        "newer pins, so the build ended; nothing was merged.",
          "nothing to do; the service closed the PR (it cannot merge) with a comment saying why"),
    Entry("tag_moved", "While the PR waits for its merge, someone moved or deleted a pinned tag in the registry: "
                       "the PR still pins the validated digest, and the merge is held (`registry_drift`) because "
                       "the tag no longer serves it.",
          f"restore the tag (the wait prints the exact `skopeo copy`; the merge then proceeds by itself), or, if "
          f"the move was meant, `{outcome.STARTER} cancel <workflow-id>` then {RESUME} (the moved target is "
          "rebuilt)", "re-checked every `policy.merge_watch_registry_interval_s` and right before merging"),
    Entry("validation_inconclusive", "The registry gave no verdict on a check (5xx, 429, network): the target "
                                     "waits (`registry_inconclusive`, then `registry_unreachable`).",
          f"nothing while it retries; once the registry answers, {RECHECK}",
          "validated again with backoff for `policy.validation_inconclusive_budget_s`, then every "
          "`policy.visibility_recheck_interval_s`"),
    Entry("validation", "A validation check failed (digest, platform, layer count or size, anonymous pull, OCI "
                        "labels, log markers): the image is not recorded.",
          f"read the failing check in {REPORT} (validation table), fix its cause upstream, then run {BUILD_AGAIN}",
          "never retried"),
]

WAITS = {
    "operator_decision": Entry("operator_decision", "A target's job failed in a way only an operator can judge "
                                                    "(`unknown`, `oom`, `timeout`, `unschedulable`).",
                               f"{DECIDE_RETRY} (resubmit) or {DECIDE_ABORT} (fail the target)",
                               "fails after `policy.operator_decision_timeout_s`"),
    "package_visibility": Entry("package_visibility", "Class `visibility`: the package is private.",
                                f"make it public, then {RECHECK}"),
    "registry_inconclusive": Entry("registry_inconclusive", "Class `validation_inconclusive`: validating again "
                                                            "with backoff.", f"nothing; or {RECHECK}"),
    "registry_unreachable": Entry("registry_unreachable", "The registry stayed silent past "
                                                          "`policy.validation_inconclusive_budget_s`; the image is "
                                                          "built and is not rebuilt.",
                                  f"once the registry answers, {RECHECK}"),
    "merge_checks": Entry("merge_checks", "The PR's required checks are not green yet (or changes are requested).",
                          f"wait, or authorize now: {APPROVE} merges once they are green; `--override-check NAME "
                          "--reason ...` merges past a check you judge not blocking"),
    "merge_authorization": Entry("merge_authorization", "The PR is green and waits for a configured operator.",
                                 f"{APPROVE} (or an `/approve-merge` comment, or an approving review)"),
    "registry_drift": Entry("registry_drift", "Class `tag_moved` or `visibility`: a pinned image changed in the "
                                              "registry after validation (by someone else); the merge is held.",
                            "restore the tag (the exact `skopeo copy` is printed) or make the package public "
                            "again; the merge then proceeds by itself"),
    "head_moved": Entry("head_moved", "Someone else pushed to the build branch: the PR head is not the pin commit the "
                                      "build pushed (the wait names who and when, from GitHub's repository "
                                      "activity). Only the pin commit is merged; no approval or override merges "
                                      "another head.",
                        "restore the branch with the printed `git push --force-with-lease` (it never overwrites a "
                        "later push), then approve again; if the new commits were meant, cancel and build them"),
    "merge_conflict": Entry("merge_conflict", "GitHub says the PR cannot merge (conflicts, or a 405 on the merge "
                                              "call). The service judged main's new commits with the rebuild "
                                              "boundary: they reach the image, or the conflict is in files it does "
                                              "not own. (Pin lines alone are rewritten on the new main by the "
                                              "service: checks run again and a new approval is asked for.)",
                            "cancel the build, then build from the new main (the command printed)"),
    "step_retrying": Entry("step_retrying", "A step failed and Temporal retries it with backoff; `follow` shows "
                                            "the attempt and the last error.",
                           "fix the cause the error names (a credential, a service); the retry is bounded and "
                           "then the build fails with it"),
}

STAGES = {
    Stage.QUEUED: "started, no worker has run it yet (`follow` says when no worker polls the task queue)",
    Stage.LOADING: "reading the configuration and the last state",
    Stage.PREPARING_SOURCE: "making the build commit (Harbor pin baked into every Dockerfile)",
    Stage.PLANNING: "reading the build contract at the build commit and rehearsing the plan",
    Stage.PLANNED: f"end of a `--plan`: nothing submitted; {REPORT} prints the plan",
    Stage.SUBMITTING: "submitting the target's Iris job (a retried submit attaches to the same job)",
    Stage.RUNNING: "the Iris job runs; `follow` shows its state and last marker",
    Stage.CAPTURING: "the job failed: capturing its log, pod events and diagnostics, then classifying",
    Stage.WAITING: "waiting for an operator or a service; the wait and its command are below",
    Stage.VALIDATING: "validating the pushed image",
    Stage.RECORDING: "writing the pin table commit, the PR and the issue comment",
    Stage.AWAITING_MERGE: "the PR waits for green required checks and an operator's authorization",
    Stage.MERGING: "merging the PR",
    Stage.DONE: "end: every image validated and recorded (the PR merged); nothing to do",
    Stage.FAILED: f"end: the failure class says why and the report gives the next step ({REPORT})",
    Stage.CANCELLED: "end: cancelled by an operator (class `cancelled`), or its PR closed or build branch deleted "
                     "on GitHub by someone (`pr_closed`, `branch_deleted`), or someone else's head merged by hand "
                     "(`merged_other_head`), or superseded by a newer build already on main (`superseded`)",
}

@dataclass(frozen=True)
class Refusal:
    """A refusal a first deploy or a first build can meet: the text the service prints (``says``, a
    fragment of one string literal in ``source``, which tests/docs/test_troubleshooting_refusals.py finds
    there; ``source`` None: the text is another program's, quoted, not checked), what it means, the fix."""

    title: str
    says: str
    source: str | None
    meaning: str
    next_step: str


PLATFORMS = "deploy/README.md, *Platforms*"
REFUSALS: list[tuple[str, list[Refusal]]] = [
    ("The rehearsal cannot isolate", [
        Refusal("required, and no isolation", "and could not run, so nothing was submitted", "rehearsal/runner.py",
                "`policy.rehearsal = \"required\"` (the shipped default) and this worker can run the build script "
                "neither under bwrap nor under proot; the message names what each lacks. Nothing was submitted.",
                f"give the worker one isolation ({PLATFORMS}): nodes with Linux ≥ 6.12 and Landlock for proot "
                "(the base Deployment), or a namespace allowing the `deploy/k8s/overlays/bwrap` settings; only "
                "if neither can be had, `policy.rehearsal = \"best_effort\"` (plans then say \"rehearsal skipped\")"),
        Refusal("kaniko not waited for", "was still running when the script exited", "rehearsal/model.py",
                "The script started its kaniko call and went on (or ended) without waiting for it: put in the "
                "background and followed by other work, or detached (`( … & )`, `setsid -f`). On the cluster "
                "the task ends with the script and kaniko is killed before it pushes. Judged from the script's "
                "statement trace under bwrap and proot alike; the message names the call's line and what ran "
                "meanwhile.",
                "run kaniko in the foreground (`exec /kaniko/executor …`, `… | tee log`, `timeout 600 "
                "/kaniko/executor …`), or `wait` for it right after starting it (`… &` then `wait $!`, or "
                "`KPID=$!` then at once `wait $KPID`)"),
        Refusal("bwrap refused by the host", "this host cannot create an isolated root", "rehearsal/runner.py",
                "bwrap could not create its user, mount and PID namespaces: the pod's seccomp/AppArmor profiles "
                "(Pod Security baseline or restricted) or the node refuse them. Under `auto` proot is tried next.",
                f"nothing if proot works (the refusal then does not appear); else see the next entries, or apply "
                f"`deploy/k8s/overlays/bwrap` where the namespace allows it ({PLATFORMS})"),
        Refusal("the kernel is too old for proot's confinement", "the kernel's Landlock ABI is",
                "rehearsal/confine.py",
                "proot runs only under Landlock ABI 6 (Linux ≥ 6.12, `landlock` in the kernel's LSM list): "
                "without it a build script could write outside its root or signal the worker.",
                f"schedule the worker on nodes with Linux ≥ 6.12 (a node selector or pool; {PLATFORMS})"),
        Refusal("proot missing", "proot is not installed on this worker", "rehearsal/proot.py",
                "The worker image lacks the Debian package `proot` (the shipped image has it).",
                "run the shipped image, or install `proot` in yours"),
        Refusal("bwrap missing", "bwrap is not installed on this worker", "rehearsal/runner.py",
                "The worker lacks the Debian package `bubblewrap` (the shipped image has it).",
                "run the shipped image, or install `bubblewrap`; proot is used meanwhile if it can run"),
    ]),
    ("An image the build pulls", [
        Refusal("a base or crane read is not in its registry", "an image the build pulls is not in its registry",
                "rehearsal/model.py",
                "Before submission every image the build pulls (each FROM after the planned build args, each full "
                "`COPY --from`, each crane read) is asked in its registry for the target's platform. The message "
                "names the Dockerfile's FROM line (or the script's crane line), the reference, the platform and "
                "the registry's answer: no such tag, digest or repository; no manifest for the platform (an "
                "amd64-only base for arm64); or refused to the credentials the job has for that host (anonymous "
                "everywhere but registry.image_repository's host). kaniko would fail there after scheduling.",
                "fix the reference (a tag that exists, a multi-platform base, a public image or one in the job's "
                "own registry) or push the image, and plan again"),
        Refusal("a registry did not answer", "could not be checked in its registry", "rehearsal/model.py",
                "A registry still answered 5xx/429 or nothing after the bounded retries, so the reference is "
                "unchecked (never counted as found, nor as missing); under `policy.rehearsal = \"required\"` "
                "that refuses. Also a `crane digest/manifest/config` probe of an image the registry lacks: the "
                "rehearsal's stand-in answered that it exists, so what the script did next is unproven.",
                "plan again when the registry answers (a pull-through cache: `policy.rehearsal_registry_mirrors`), "
                "or pass `build --accept-unrehearsed` to plan with it unchecked (the report records it)"),
    ]),
    ("Preflight", [
        Refusal("preflight failed", "preflight failed, nothing was pushed, submitted or opened", "domain/models.py",
                "Before the first side effect the service proves every credential, permission, tool, Iris and the "
                "build script; each failed check is listed as `name (config key): detail`.",
                "fix each named check at its configuration key, then run the same `build` again"),
        Refusal("no push access (git)", "git cannot push to the repository", "activities/preflight.py",
                "`git push --dry-run` of a probe branch to `repos.marinskyrl_url` was refused.",
                "give the credential at the named key (`github.token`, `github.app` or the git credential) write "
                "access to the repository, or point `repos.marinskyrl_url` at one it may push to"),
        Refusal("no push permission (GitHub)", "the token may not push to", "activities/preflight.py",
                "GitHub says the token's permissions on the repository lack push.",
                "use a token (or App installation) with write access to the repository"),
        Refusal("a classic token without the repo scope", "lacks the scope repo", "activities/preflight.py",
                "A classic token's `X-OAuth-Scopes` lack `repo` (contents, pull requests, issues, statuses).",
                "regenerate the token with the `repo` scope, or use a fine-grained token or the GitHub App"),
        Refusal("a registry token without write:packages", "lacks the scope write:packages",
                "activities/preflight.py",
                "`registry.token` is a classic token whose scopes lack `write:packages`: kaniko's push would fail "
                "on the cluster after the build.",
                "regenerate it with `write:packages` (and `read:packages`)"),
        Refusal("an App installation without a permission", "add them to the App and accept them on the "
                "installation", "activities/preflight.py",
                "The GitHub App's installation was not granted a permission the build needs (listed with what "
                "it has).",
                "add the permissions to the App, then accept them on the installation (GitHub sends the owner a "
                "request)"),
        Refusal("checks or statuses unreadable (403)", "the token may not read", "activities/preflight.py",
                "A fine-grained or installation token may not read check runs or commit statuses: the merge gate "
                "could never see CI.",
                "grant the permission the message names (`checks: read`, `commit statuses: read`)"),
        Refusal("branch protection unreadable (403)", "the token needs administration read",
                "activities/merge_gate.py",
                "Not a refusal: the token may not read the base branch's protection (GitHub answers 403 without "
                "administration read), so the merge gate takes the required checks from rulesets or "
                "`github.required_checks` and says so in the wait.",
                "grant administration: read (fine-grained token or App), or list the checks in "
                "`github.required_checks`"),
    ]),
    ("Iris", [
        Refusal("client too old", "refuses this client as too old", "clients/iris.py",
                "The cluster's controller refuses the client revision date this worker sends (its marin-iris "
                "release, or `clusters.<name>.client_revision_date`): the controller was upgraded past it.",
                "upgrade gpu-rl-builder to a release built on a newer marin-iris (docs/iris-upgrade.md) and "
                "redeploy the worker; remove a stale `client_revision_date` override"),
        Refusal("no log server behind the endpoint proxy", "no log server answers behind the controller's endpoint "
                "proxy", "clients/iris.py",
                "Not a refusal and never a verdict on the job: a log read got HTTP 404 from "
                "`/proxy/system.log-server/...` (the controller has no `/system/log-server` endpoint at the moment, or "
                "`controller_url` reaches a listener other than the controller's public port, which alone serves "
                "`/proxy/`). Log reads are retried as transient; job states are still read and nothing is "
                "concluded from the unread log.",
                "if it lasts, check that `clusters.<name>.controller_url` (or the port-forward) reaches the "
                "controller's public port and that the controller lists the `/system/log-server` endpoint"),
    ]),
    ("No worker", [
        Refusal("no worker polls the task queue (build)", "no worker polls task queue", "starter.py",
                "Temporal sees no worker on `temporal.task_queue`: the request cannot be checked, so nothing was "
                "started (exit code 3).",
                "start a worker with the same configuration (`python worker.py`, or the Deployment); on "
                "Kubernetes check it is running: `kubectl -n gpu-rl-builder get deploy,rs,pods`"),
        Refusal("no worker is polling (follow)", "no worker is polling", "runtime/operator_client.py",
                "The build is queued or mid-step and no worker polls its task queue; it carries on by itself "
                "once one does.",
                "start a worker with the same `temporal.task_queue`; a Deployment at 0/1 is the next entry"),
        Refusal("the Deployment stays at 0/1", "violates PodSecurity", None,
                "Kubernetes' own event (`FailedCreate` on the ReplicaSet): the namespace's Pod Security level "
                "refuses the pod. The base Deployment passes `baseline` and `restricted`; the `bwrap` overlay "
                "needs `privileged`; OpenShift's restricted-v2 refuses the fixed UID without its overlay.",
                f"`kubectl -n gpu-rl-builder describe rs -l app.kubernetes.io/name=gpu-rl-builder` names the "
                f"checks; apply the overlay for the platform ({PLATFORMS})"),
    ]),
]

EXIT_CODES = [(0, "success, or the build runs (without `--follow`)"), (1, "the build or the command failed"),
              (2, "bad input: a flag, the configuration, or a request the build contract refuses"),
              (3, "a service (Temporal, Iris, the registry, GitHub) is unreachable")]


def target_classes() -> list[Entry]:
    return [Entry(str(c), _TARGET_MEANING.get(c, failures.HINTS[c]), _TARGET_NEXT[c], _retry_text(c))
            for c in failures.FailureClass]


def failure_classes() -> list[Entry]:
    """Every BuildFailureClass value with its entry (a target's class, then the service's)."""
    return target_classes() + SERVICE_CLASSES


def wait_kinds() -> list[str]:
    return list(typing.get_args(WaitingReason.model_fields["kind"].annotation))


def troubleshooting_markdown() -> str:
    out = [
        "# Troubleshooting",
        "",
        "<!-- Generated by scripts/gen-docs from domain/troubleshooting.py (classes from domain/failures.py, "
        "next steps and commands from domain/outcome.py); do not edit by hand. -->",
        "",
        "Where to look: `python starter.py follow <workflow-id>` (live), `python starter.py report <workflow-id>` "
        "(how it ended: class, message, next step), `python starter.py logs <workflow-id> [target]` (the failing "
        "line), `python starter.py evidence <workflow-id>`, and the Temporal UI's *Current Details*. "
        "`python starter.py status --query \"BuildStage = 'waiting'\"` lists what waits for you.",
        "",
        "## Exit codes",
        "",
        "| Code | Meaning |",
        "|---|---|",
        *[f"| {code} | {text} |" for code, text in EXIT_CODES],
        "",
        "## Failure classes",
        "",
        "The `BuildFailureClass` search attribute, the report's `failure_class` and `follow`'s `[class]`.",
    ]
    for title, entries in (("A target's job", target_classes()), ("The service and its steps", SERVICE_CLASSES)):
        out += ["", f"### {title}", ""]
        for e in entries:
            out += [f"#### `{e.name}`", "", e.meaning, ""]
            if e.retried:
                out += [f"- **The service:** {e.retried}."]
            out += [f"- **Next step:** {e.next_step}.", ""]
    out += ["## Refusals of a first deploy or a first build", "",
            "The text each one prints (quoted as the service prints it; tests/docs/test_troubleshooting_refusals.py "
            "finds it in the source named), what it means, and what to do.", ""]
    for title, refusals in REFUSALS:
        out += [f"### {title}", ""]
        for r in refusals:
            where = f" (`{r.source}`)" if r.source else " (Kubernetes' text, not this service's)"
            out += [f"#### {r.title}", "", f"Says: \"…{r.says}…\"{where}", "", r.meaning, "",
                    f"- **Next step:** {r.next_step}.", ""]
    out += ["## Waits", "", "A waiting build shows `waiting` and, in `follow`, the report and the UI, the exact "
            "command that unblocks it.", ""]
    for kind in wait_kinds():
        e = WAITS[kind]
        out += [f"### `{kind}`", "", e.meaning, ""]
        if e.retried:
            out += [f"- **The service:** {e.retried}."]
        out += [f"- **Next step:** {e.next_step}.", ""]
    out += ["## Stages", "", "The `BuildStage` search attribute (pipeline and targets).", "",
            "| Stage | Meaning |", "|---|---|"]
    out += [f"| `{s.value}` | {STAGES[s]} |" for s in Stage]
    return "\n".join(out) + "\n"
