"""Patch ids of workflow changes made while builds may be running (the rule: docs/versioning.md).

Why one place: a patch id is part of every history that passed the patched code; renaming or reusing
one breaks running builds. Each id says what changed and when, and lives here until the cleanup steps
in docs/versioning.md retire it (``workflow.deprecate_patch`` first, then removal).
"""

# TargetBuildWorkflow publishes each evidence file (store URI + sha256) in its memo, for the UI.
EVIDENCE_MEMO = "target-evidence-memo-2026-12"

# BuildPipelineWorkflow runs the preflight activity before the first side effect (publishing the branch).
PREFLIGHT = "preflight"

# TargetBuildWorkflow validates again, with backoff, while the registry answers inconclusively.
VALIDATION_SETTLE = "validation-settle-inconclusive"

# TargetBuildWorkflow registers its job with the per-cluster Iris watcher and sleeps until woken, instead of
# one monitor_job activity per progress interval (runs started before keep polling).
CLUSTER_WATCHER = "iris-cluster-watcher"

# BuildPipelineWorkflow continues as new while waiting for the merge once its history grows past
# PipelineInput.merge_wait_events_per_run (runs started before never do).
MERGE_WAIT_CONTINUE_AS_NEW = "merge-wait-continue-as-new"

# IrisWatcherWorkflow continues as new carrying only the previous run's id (its watch set is adopted in
# pages by the watch activity), not the whole watch set (runs started before carry it, as they did).
WATCHER_BOUNDED = "watcher-bounded-watch-set"

# BuildPipelineWorkflow asks, per target, whether an earlier run of the same build commit already validated
# it (adopt_validated) before starting the target's child workflow; an adopted target is not rebuilt.
ADOPT_VALIDATED = "adopt-validated-targets"

# BuildPipelineWorkflow and RebuildCheckWorkflow started without a BuildKind search attribute tag
# themselves (build/plan, rebuild-check) with one upsert (runs started before never do).
BUILD_KIND = "build-kind-search-attribute"

# Operator commands are verified on the worker (approve_merge / decide run the authorize_operator activity:
# configured operator, Temporal identity, PR comment) instead of taking ``--by`` on trust.
OPERATOR_AUTHORIZATION = "operator-authorization"

# BuildPipelineWorkflow's merge wait keeps an accepted authorization while required checks are pending or
# red (merging as soon as they are green, or overridden), adopts operators' approvals on GitHub, and
# withdraws an authorization only when the head moves or the merge is refused.
MERGE_GATE = "merge-gate-required-checks"

# TargetBuildWorkflow fails with its job ids and the step's own error (a TargetFailed result) when a step
# (activity) fails for good, instead of re-raising the bare activity error (runs started before re-raise).
TARGET_STEP_FAILURE = "target-step-failure-result"
# TargetBuildWorkflow's long waits (operator decision, package visibility, an unreachable registry past the
# validation budget) continue as new once a run's history or age is long; a re-check that changes nothing
# upserts and signals nothing; the registry past the budget is waited for (recheck), not failed.
BOUNDED_WAITS = "bounded-target-waits"

# BuildPipelineWorkflow's merge wait ends when someone else ends what it waits for on GitHub: the PR closed
# unmerged, or its build branch deleted (runs started before kept waiting on a closed PR).
CLOSED_OUTSIDE = "merge-wait-closed-outside"

# RebuildCheckWorkflow asks whether an operator cancelled the rebuild of these very commits (earlier_rebuild)
# and starts it again only with --force; it starts the variants the decision names (runs started before
# started the whole request, and restarted a cancelled one).
REBUILD_CANCEL_MEMORY = "rebuild-cancel-memory"

# BuildPipelineWorkflow's merge wait merges only the pin commit it pushed: a PR head that is anything else holds
# the merge (naming who pushed it and the restore command), and the merge call is given the pin commit's sha.
MERGE_PIN_COMMIT = "merge-only-the-pin-commit"

# BuildPipelineWorkflow's merge wait judges a PR GitHub cannot merge (resolve_conflict): superseded by newer pins
# on main ends the build, changes that reach the image wait with the rebuild command, pin lines alone are
# rewritten on the new main (new pin commit, checks again, a new approval).
MERGE_CONFLICT = "merge-conflict-judged"

# TargetBuildWorkflow acts on its job's end before telling the pipeline: the log check (or failure capture) is
# scheduled in the same workflow task as the pipeline's signal, not one task after the signal's round trip
# (issue 37: end -> act). Runs started before awaited the signal first.
ACT_BEFORE_TELLING = "target-act-before-telling-pipeline"
