"""A succeeded build whose log lost lines, on the real 0.2.227 controller and a real registry (issue #26).

What happens there (bench/log_loss.py, docs/benchmarks.md): the worker's finelog client keeps at most
10,000 unsent lines and drops the oldest beyond that, before the store numbers them, so the markers printed
before a 20,000-line burst are gone and the stored ``seq`` shows no gap. The image the job pushed is the
evidence that cannot be dropped: a good image validates with it standing in; without a provable image the
target ends ``log_lost`` at once, with its next step."""

from __future__ import annotations

import asyncio
import datetime
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.build import BuildActivities
from domain.config import ServiceConfig
from domain.contract.models import LayerCeiling
from domain.log_evidence import seq_gaps, unexplained_gaps
from domain.markers import DIGEST_RE, Marker, check_log
from domain.models import CaptureInput, LogCheckInput, ValidateInput
from sandbox.git_remotes import MARINSKYRL_FIXTURE
from tests.iris.helpers import bash_spec
from tests.workflows.standins import target_input

pytestmark = pytest.mark.stack

STANDIN = MARINSKYRL_FIXTURE / "docker" / "kaniko_standin.py"
COMMIT, HARBOR = "1" * 40, "2" * 40
BURST = 20_000
LAYER_ECHO = 'echo "uv sync layer 0 (small pkgs + torch) done"'
ARCH_LINE = "[arch] build host=x86_64"
DOCKERFILE = f"""\
FROM scratch AS rl
ARG GITSHA
ARG HARBOR_COMMIT
LABEL org.opencontainers.image.source="https://github.com/marin-community/MarinSkyRL" \\
      org.opencontainers.image.revision="${{GITSHA}}" \\
      org.marin.harbor-commit="${{HARBOR_COMMIT}}"
RUN {LAYER_ECHO}
"""


def _config(tmp_path: Path, url: str, registry_host: str) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": "file:///nowhere", "harbor_url": "file:///nowhere"},
        "clusters": {"local": {"controller_url": url, "iris_user": "tester",
                               "client_revision_date": datetime.date.today().isoformat()}},
        "registry": {"image_repository": f"{registry_host}/evidence", "insecure_hosts": [registry_host],
                     "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "NO_SUCH_X"}},
    })


def _markers(repo: str, tag: str) -> list[Marker]:
    """As expected_markers plans them: a script echo under `set -e`, a Dockerfile echo, kaniko's push."""
    return [
        Marker(name=ARCH_LINE, text=ARCH_LINE, source="script", image_proof="script"),
        Marker(name="uv sync layer 0 (small pkgs + torch) done", text="uv sync layer 0 (small pkgs + torch) done",
               source="docker/Dockerfile.gpu-rl", template=LAYER_ECHO, step=f"RUN {LAYER_ECHO}", must_run=True),
        Marker(name=f"push {repo}:{tag}", text=f"Pushing image to {repo}:{tag}", source="kaniko", role="push"),
        Marker(name=f"pushed {repo}@sha256", pattern=re.escape(f"Pushed {repo}@") + DIGEST_RE, source="kaniko",
               role="pushed"),
    ]


def _target(repo: str, tag: str):
    return target_input("evidence").target.model_copy(update={
        "expected_markers": _markers(repo, tag), "image_repository": repo, "tag": tag,
        "kaniko_platform": "linux/amd64",
        "layer_ceiling": LayerCeiling(max_layer_bytes=8_000_000_000, warn_layer_bytes=4_000_000_000, min_layers=1)})


async def _run_to_end(iris, name: str, script: str) -> str:
    """Launch, wait for the terminal state, and return the whole stored log as check_build_log reads it."""
    await iris.launch_job(bash_spec(name, script))
    for _ in range(2400):  # bounded: 2 minutes
        state = (await iris.job_states([name])).get(name)
        if state and state.is_terminal:
            break
        await asyncio.sleep(0.05)
    assert state and state.value == "succeeded", state
    log = await iris.read_complete_log(f"{name}/", "prefix")
    return "".join(f"{e.data}\n" for e in log.entries)


def _check_input(name: str, target) -> LogCheckInput:
    return LogCheckInput(request_id="evidence", job_id=name, cluster="local", target=target, build_commit=COMMIT,
                         harbor_commit=HARBOR)


async def test_a_good_image_whose_markers_a_burst_pushed_out_of_the_log_validates(iris_controller, iris_client,
                                                                                 open_registry, tmp_path):
    """The kaniko stand-in builds and pushes a good image; a job prints the build's output with a 20,000-line
    burst after the markers, then kaniko's push lines. Whatever the store keeps, the image validates. Where the
    store drops the markers depends on when the worker's log client flushes (bench/log_loss.py: the marker
    before a 20,000-line burst was lost 3 of 3 times in one run, kept in others while middle lines went), so
    the second job prints what the store kept in the losing runs: the burst's newest 10,000 lines and the
    push, no marker. To the service the two are the same log; only the image can tell."""
    acts = BuildActivities(_config(tmp_path, iris_controller.url, open_registry.host))
    ctx = tmp_path / "app"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    python3 = shutil.which("python3") or "/usr/bin/python3"
    repo, tag = f"{open_registry.host}/evidence", f"burst-{uuid.uuid4().hex[:8]}"
    built = subprocess.run(
        [python3, str(STANDIN), "--context", f"dir://{ctx}", "--dockerfile", str(ctx / "Dockerfile"),
         "--destination", f"{repo}:{tag}", "--insecure-registry", open_registry.host, "--build-arg",
         f"GITSHA={COMMIT}", "--build-arg", f"HARBOR_COMMIT={HARBOR}", "--custom-platform", "linux/amd64"],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "DOCKER_CONFIG": str(tmp_path / "no-docker-config")})
    assert built.returncode == 0, built.stderr
    out = tmp_path / "build.out"
    out.write_text(f"{ARCH_LINE}\n{built.stdout}")
    target = _target(repo, tag)
    jobs = {"burst": f"head -n -2 {out}; seq 1 {BURST}; tail -n 2 {out}",
            "markers dropped": f"seq {BURST - 9_999} {BURST}; tail -n 2 {out}"}
    for what, script in jobs.items():
        name = f"/tester/evidence-{uuid.uuid4().hex[:8]}"
        text = await _run_to_end(iris_client, name, f"set -euo pipefail; {script}")
        stored = check_log(target.expected_markers, text)
        assert stored.final_push_seen, text[-2000:]  # the newest lines, kaniko's push, always survive
        if what == "markers dropped":
            assert stored.missing == [ARCH_LINE, "uv sync layer 0 (small pkgs + torch) done"]
        check = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, target))
        assert (check.missing, check.lost, check.final_push_seen) == ([], [], True), (what, check)
        assert set(check.stood_in) == set(stored.missing), (what, check.stood_in)
        if stored.missing:
            assert any("absence is not proof" in r for r in check.incomplete)
            assert "is a step of the image" in check.stood_in["uv sync layer 0 (small pkgs + torch) done"]
        print(f"{what}: the store kept {len(text.splitlines()):,} lines; the image stood in for "
              f"{len(check.stood_in)} marker(s)")
        report = await ActivityEnvironment().run(acts.validate_image, ValidateInput(
            target=target, build_commit=COMMIT, harbor_commit=HARBOR, claimed_digest=check.pushed_digest))
        assert report.ok, report.failure_summary()


async def test_a_lost_log_the_image_cannot_prove_ends_log_lost_with_its_next_step(iris_controller, iris_client,
                                                                                  open_registry, tmp_path):
    """Markers lost behind a burst, and a job that prints nothing at all: no image at the tag, so nothing
    stands in. The step answers at once (no Transient, nothing read again) and the failure is log_lost."""
    acts = BuildActivities(_config(tmp_path, iris_controller.url, open_registry.host))
    repo = f"{open_registry.host}/evidence"
    for what, body in (("burst", f"echo '{ARCH_LINE}'; echo 'uv sync layer 0 (small pkgs + torch) done'; "
                                 f"seq 1 {BURST}"),
                       ("silent", "true")):
        tag = f"never-pushed-{uuid.uuid4().hex[:8]}"
        name = f"/tester/lost-{what}-{uuid.uuid4().hex[:8]}"
        push = f"; echo 'INFO Pushing image to {repo}:{tag}'; echo 'INFO Pushed {repo}@sha256:{'cd' * 32}'"
        text = await _run_to_end(iris_client, name, body + (push if what == "burst" else ""))
        target = _target(repo, tag)
        if what == "burst" and not check_log(target.expected_markers, text).missing:
            continue  # the store kept the markers this time; the silent job below still loses everything
        check = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, target))
        assert check.missing and check.lost, check
        assert check.lost[0].startswith(f"the image cannot stand in for the lost log: no image at {repo}:{tag}")
        if what == "silent":
            assert check.missing == [m.name for m in target.expected_markers]
            assert "the log store holds no line of the job" in check.lost[1]
        captured = await ActivityEnvironment().run(acts.capture_failure, CaptureInput(
            request_id="evidence", job_id=name, cluster="local", target_key=target.key,
            missing_markers=check.missing, log_lost=check.lost))
        c = captured.classification
        assert (str(c.failure_class), c.reasons) == ("log_lost", check.lost)
        assert "starter.py resume" in c.operator_hint


async def test_seq_gaps_between_a_jobs_lines_are_other_jobs_lines_not_holes(iris_controller, iris_client):
    """What the store's seq is: one counter for every key, so concurrent jobs interleave; the store can say
    which ids of a gap it holds (every one here: no hole), which is how a real hole would show."""
    names = [f"/tester/seq-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for name in names:
        await iris_client.launch_job(bash_spec(name, "for i in $(seq 1 300); do echo $i; sleep 0.002; done"))
    for name in names:
        await _run_to_end_wait(iris_client, name)
    logs = [await iris_client.read_complete_log(f"{n}/", "prefix") for n in names]
    assert [len(log.entries) for log in logs] == [300, 300, 300]
    gaps = [g for log in logs for g in seq_gaps((e.key, e.seq) for e in log.entries)]
    assert gaps, "three concurrent jobs printing for ~1 s did not interleave"
    stored = {(g.after, g.before): await iris_client.stored_rows_between(g.after, g.before) for g in gaps}
    assert unexplained_gaps(gaps, stored) == [] and all(stored[(g.after, g.before)] == g.ids for g in gaps)
    ours = sorted(e.seq for log in logs for e in log.entries)
    assert await iris_client.stored_rows_between(ours[0] - 1, ours[-1] + 1) >= len(ours)


async def _run_to_end_wait(iris, name: str) -> None:
    for _ in range(2400):  # bounded: 2 minutes
        state = (await iris.job_states([name])).get(name)
        if state and state.is_terminal:
            assert state.value == "succeeded", state
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} did not end")
