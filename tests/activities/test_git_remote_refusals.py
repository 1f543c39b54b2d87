"""A git remote whose answer is final fails at once, typed, naming the remote; only the network retries.

Real git against real remotes: a deleted ``file://`` remote, and a smart-HTTP remote served by
``git http-backend`` (sandbox/git_http.py) that refuses a wrong token (401), a read-only token's push
(403) and a repository it does not have (404). The activity runs under a real Temporal worker with
the service's own retry policy, so "no retries" is the server's attempt count, not an assumption.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities import errors
from activities.source import SourceActivities
from clients import git_source
from domain.models import BuildState, LoadStateInput
from sandbox.git_http import GitHttpRemote
from tests.activities.test_error_boundary import _config
from tests.fixtures_git import fresh_remotes

with workflow.unsafe.imports_passed_through():
    from workflows import options

TOKEN = "grb-sentinel-" + "k" * 24  # must never appear in an error


@workflow.defn(sandboxed=False)
class LoadOnce:
    """The pipeline's first step with the pipeline's own options (workflows/options.py)."""

    @workflow.run
    async def run(self, inp: LoadStateInput) -> BuildState:
        return await workflow.execute_activity("load_build_state", inp, result_type=BuildState,
                                               **options.LOAD_STATE)


@pytest.fixture
def http_remote(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")
    served = GitHttpRemote(Path(remotes.root), users={"alice": TOKEN, "reader": TOKEN + "-ro"},
                           writers={"alice"}).start()
    yield remotes, served
    served.stop()


def _with(remotes, **urls):
    return remotes.model_copy(update=urls)


async def _load(tmp_path, remotes) -> BaseException:
    """The refusal of one load (a credential prompt would hang here until the test's timeout)."""
    acts = SourceActivities(_config(tmp_path, remotes))
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(acts.load_build_state, LoadStateInput(request_id="r", harbor_ref="main"))
    return info.value


async def test_a_deleted_remote_is_not_found_at_once_naming_it(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")
    shutil.rmtree(remotes.marinskyrl_url.removeprefix("file://"))
    err = await _load(tmp_path, remotes)
    assert err.type == "NotFound" and err.non_retryable and err.type in options.IO_RETRY.non_retryable_error_types
    assert "marinskyrl.git" in err.message and "does not exist" in err.message


async def test_a_refused_credential_is_authentication_failed_naming_the_remote_not_the_token(tmp_path, http_remote):
    remotes, served = http_remote
    err = await _load(tmp_path, _with(remotes, marinskyrl_url=served.url("marinskyrl.git", "alice", "wrong-"
                                                                                + TOKEN)))
    assert err.type == "AuthenticationFailed" and err.non_retryable
    assert f"127.0.0.1:{served.server.server_address[1]}/marinskyrl.git" in err.message
    assert TOKEN not in err.message and "wrong-" not in err.message


async def test_a_repository_the_host_does_not_have_is_not_found(tmp_path, http_remote):
    remotes, served = http_remote
    err = await _load(tmp_path, _with(remotes, harbor_url=served.url("no-such-harbor.git", "alice", TOKEN)))
    assert err.type == "NotFound" and "no-such-harbor.git" in err.message and TOKEN not in err.message


async def test_a_read_only_credential_cannot_push_permission_denied(tmp_path, http_remote):
    remotes, served = http_remote
    mirror = git_source.MirrorCache(tmp_path / "m").fetch(served.url("marinskyrl.git", "reader", TOKEN + "-ro"))
    with pytest.raises(git_source.RemotePermissionDenied) as info:
        git_source.check_push_access(mirror, served.url("marinskyrl.git", "reader", TOKEN + "-ro"), "probe",
                                     mirror.head_sha)
    mapped = errors.classify_exception(info.value)
    assert mapped.type == "PermissionDenied" and mapped.non_retryable and TOKEN not in mapped.message
    # and with the writer's token the same probe is accepted (the 403 was about permission, not the server)
    git_source.check_push_access(mirror, served.url("marinskyrl.git", "alice", TOKEN), "probe", mirror.head_sha)


async def test_network_level_failures_stay_transient(tmp_path):
    remotes = fresh_remotes(tmp_path / "remotes")
    err = await _load(tmp_path, _with(remotes, marinskyrl_url="http://127.0.0.1:1/marinskyrl.git"))
    assert err.type == "Transient" and not err.non_retryable
    for stderr in ("fatal: unable to access 'https://h/x.git/': Could not resolve host: h",
                   "fatal: unable to access 'https://h/x.git/': The requested URL returned error: 502",
                   "error: RPC failed; curl 56 Recv failure: Connection reset by peer\nfatal: early EOF"):
        assert type(git_source.classify_git_failure("fetch", "https://h/x.git", 128, stderr)) is \
            git_source.GitCommandFailed


@pytest.mark.parametrize("kind", ["deleted", "refused"])
async def test_under_temporal_the_refusal_is_one_attempt_and_ends_the_step_in_seconds(
        tmp_path, http_remote, temporal_client, kind):
    remotes, served = http_remote
    if kind == "deleted":
        shutil.rmtree(remotes.marinskyrl_url.removeprefix("file://"))
    else:
        remotes = _with(remotes, marinskyrl_url=served.url("marinskyrl.git", "alice", "nope"))
    client = temporal_client
    tq, wid = f"git-refusal-{uuid.uuid4().hex[:8]}", f"git-refusal-{kind}-{uuid.uuid4().hex[:8]}"
    acts = SourceActivities(_config(tmp_path, remotes))
    async with Worker(client, task_queue=tq, workflows=[LoadOnce], activities=[acts.load_build_state]):
        with pytest.raises(WorkflowFailureError) as info:
            await asyncio.wait_for(client.execute_workflow(
                LoadOnce.run, LoadStateInput(request_id="r", harbor_ref="main"), id=wid, task_queue=tq,
                execution_timeout=timedelta(minutes=2)), 60)
    cause = info.value.cause
    assert isinstance(cause, ActivityError) and cause.retry_state is not None
    app = cause.cause
    assert isinstance(app, ApplicationError)
    assert app.type == ("NotFound" if kind == "deleted" else "AuthenticationFailed"), app.message
    assert TOKEN not in app.message
    attempts = [e for e in (await client.get_workflow_handle(wid).fetch_history()).events
                if e.HasField("activity_task_started_event_attributes")]
    assert [e.activity_task_started_event_attributes.attempt for e in attempts] == [1]
