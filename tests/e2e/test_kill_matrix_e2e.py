"""Kill matrix: the worker is SIGKILLed while each step of one build runs (load, publish, submit,
validate, record, merge); each time a new worker with an EMPTY work directory takes over.

Real processes and services (worker.py subprocesses, Temporal dev server, Iris, token registry, git
remotes, GitHub stand-in). Every step runs again within a minute of the new worker's start (the
driver's bounded wait, sandbox/kill_matrix.py), and the build ends merged with exactly one of each
side effect: one Iris job, one build commit, one pin commit, one PR, one issue comment, one merge.
The resume times are printed; bench/resume_after_kill.py measures them for the record.
"""

from __future__ import annotations

import subprocess

import httpx
import pytest

from clients.github import GitHubClient
from clients.iris import IrisClient
from sandbox.git_remotes import remote_head
from sandbox.kill_matrix import PHASES, KillMatrix, table
from sandbox.stack import MARINSKYRL_SLUG
from tests.e2e.helpers import request, start_pipeline

pytestmark = pytest.mark.stack
ISSUE = "https://github.com/marin-community/MarinSkyRL/issues/7"


# Seven worker starts and kills in sequence, each step's resume bounded by the driver (resume_bound_s): on an
# idle 2-core machine about 2 minutes, beside stress-ng --cpu 2 past the suite's 300 s default.
@pytest.mark.timeout(900)
async def test_worker_killed_in_every_step_resumes_within_a_minute_with_one_of_each_side_effect(service_config):
    s = service_config
    s.token_registry.set_public(s.image_repo_path, True)  # this test is about crashes, not the visibility gate
    handle = await start_pipeline(s, request(issue_url=ISSUE))
    matrix = KillMatrix(client=s.client, config_path=s.config_path, state_dir=s.state_dir, github=s.github,
                        repo_slug=MARINSKYRL_SLUG)
    final = await matrix.run(handle)
    print("\n" + table(matrix.results))

    assert [r.phase for r in matrix.results] == [p.name for p in PHASES]
    assert all(r.resume_s <= matrix.resume_bound_s for r in matrix.results)
    assert final.status == "merged" and final.merge_commit
    assert remote_head(s.remotes.marinskyrl_url) == final.merge_commit

    # One Iris job: the submit retried on the new worker attached to (or made) the same one.
    (target,) = final.targets
    assert len(target.job_ids) == 1
    async with IrisClient(s.iris.url, client_revision_date=s.config.clusters["sandbox-amd64"].client_revision_date) as iris:
        jobs = await iris.list_jobs(prefix=target.job_ids[0])
    assert [j.job_id for j in jobs] == target.job_ids

    # One build commit and one pin commit, whichever worker made them (reproducible from the inputs).
    messages = subprocess.run(["git", "--git-dir", s.remotes.marinskyrl_url.removeprefix("file://"), "log", "--all",
                               "--format=%B%x00"], capture_output=True, text=True, check=True).stdout
    trailers = [line for line in messages.splitlines() if line.startswith("Build-Request: ")]
    assert trailers.count(f"Build-Request: {handle.id}") == 1
    assert trailers.count(f"Build-Request: {handle.id}-pins") == 1

    # One PR (merged once) and one comment on the issue: the stand-in is this test's own.
    async with GitHubClient(s.github.api_url, s.github.token, MARINSKYRL_SLUG) as gh:
        pr = await gh.get_pull(final.pull_request.number)
        comments = await gh.list_issue_comments(7)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {s.github.token}"}) as http:
        pulls = (await http.get(f"{s.github.api_url}/repos/{MARINSKYRL_SLUG}/pulls", params={"state": "all"})).json()
    assert [p["number"] for p in pulls] == [pr.number]
    assert pr.merged and pr.merge_commit_sha == final.merge_commit
    assert len(comments) == 1

    # No worker wrote a secret to its log.
    logs = "".join(p.read_text(errors="replace") for p in s.state_dir.glob("worker-*.log"))
    for secret in (s.token_registry.push_token, s.github.token):
        assert secret and secret not in logs
