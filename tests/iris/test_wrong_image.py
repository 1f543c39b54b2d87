"""A wrong image never validates, on the real 0.2.227 controller and a real registry (issue #34).

A megatron target whose Dockerfile gained `ENV INSTALL_MEGATRON=0` builds (kaniko stand-in, the fixture's
real Dockerfile) a non-megatron image: its complete log contradicts the plan (assertion_failure naming the
line); where the log is silent or lost, the image's own check (the step's `python3 -c "import megatron.core"`)
runs in an Iris job whose task image is the pushed digest (here laid out by sandbox/image_run_standin.py) and
answers with the excluded branch: assertion_failure too. History text proves no value and no branch. A job that pushes
nothing while an earlier image of the commit sits at the tag is "adopted, not built by this job" and passes
only where policy.allow_adopted_image says so."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.build import BuildActivities
from domain.contract.models import LayerCeiling
from domain.markers import expected_markers
from domain.models import CaptureInput, ValidateInput
from tests.contract.helpers import DF_AMD, FIXTURE, contract, edited, fixture_files
from tests.iris.test_log_evidence import BURST, COMMIT, HARBOR, STANDIN, _check_input, _config, _run_to_end
from tests.workflows.standins import target_input

pytestmark = pytest.mark.stack

MEG = "Megatron native imports OK"
NOT_MEG = "megatron backend not installed (INSTALL_MEGATRON=0)"
FINAL = "uv sync FINAL (vllm, cufft, triton, nvshmem, nvrtc + closure verify) done"
ENV_OFF = ("FROM base AS rl\n", "FROM base AS rl\nENV INSTALL_MEGATRON=0\n")


RUNNER = [shutil.which("python3") or "/usr/bin/python3", str(Path(__file__).resolve().parents[2] / "sandbox"
                                                            / "image_run_standin.py")]


def _acts(tmp_path: Path, url: str, host: str, **policy) -> BuildActivities:
    """The activities with the sandbox's image runner on the local cluster (its tasks run on the host)."""
    config = _config(tmp_path, url, host)
    local = config.clusters["local"].model_copy(update={"image_check_runner": RUNNER})
    return BuildActivities(config.model_copy(update={
        "clusters": {**config.clusters, "local": local},
        "policy": config.policy.model_copy(update=policy)}))


def _context(tmp_path: Path, files: dict[str, str]) -> Path:
    ctx = tmp_path / "ctx"
    shutil.copytree(FIXTURE, ctx, ignore=shutil.ignore_patterns("kaniko_standin.py"))
    for rel, text in files.items():
        (ctx / rel).write_text(text)
    return ctx


def _build(ctx: Path, ref: str, host: str, tmp_path: Path, *, megatron: str, push: bool = True,
           extra: tuple[str, ...] = ()) -> str:
    python3 = shutil.which("python3") or "/usr/bin/python3"
    built = subprocess.run(
        [python3, str(STANDIN), "--context", f"dir://{ctx}", "--dockerfile", str(ctx / DF_AMD),
         "--destination", ref, "--insecure-registry", host, "--build-arg", f"GITSHA={COMMIT}",
         "--build-arg", f"HARBOR_COMMIT={HARBOR}", "--build-arg", f"INSTALL_MEGATRON={megatron}",
         "--build-arg", "WHEEL_SOURCE=wheel-builder", "--custom-platform", "linux/amd64",
         *([] if push else ["--no-push"]), *extra],
        capture_output=True, text=True, timeout=180,
        env={"PATH": "/usr/bin:/bin", "DOCKER_CONFIG": str(tmp_path / "no-docker-config")})
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return built.stdout


def _target(files, variant: str, repo: str, tag: str):
    planned = expected_markers(contract(files, commit=COMMIT), "amd64", variant, "wheel-builder", tag, image_repository=repo)
    markers = [m for m in planned if m.source != "script"]  # the stand-in runs alone here: no script lines
    return target_input("wrong-image").target.model_copy(update={
        "expected_markers": markers, "image_repository": repo, "tag": tag, "kaniko_platform": "linux/amd64",
        "layer_ceiling": LayerCeiling(max_layer_bytes=8_000_000_000, warn_layer_bytes=4_000_000_000, min_layers=1)})


async def _capture(acts, name, target, check):
    captured = await ActivityEnvironment().run(acts.capture_failure, CaptureInput(
        request_id="evidence", job_id=name, cluster="local", target_key=target.key, missing_markers=check.missing,
        log_lost=check.lost, contradicted=check.contradicted))
    return captured.classification


async def test_a_megatron_target_whose_image_lacks_megatron_never_validates(iris_controller, iris_client,
                                                                           open_registry, tmp_path):
    acts = _acts(tmp_path, iris_controller.url, open_registry.host)
    files = edited(DF_AMD, lambda t: t.replace(*ENV_OFF), fixture_files(HARBOR))
    repo, tag = f"{open_registry.host}/evidence", f"gpu-rl-megatron-{uuid.uuid4().hex[:8]}"
    target = _target(files, "megatron", repo, tag)
    assert any(m.name == MEG for m in target.expected_markers)  # the plan reads the ARG the job passes: 1
    names = {what: f"/tester/wrong-{what}-{uuid.uuid4().hex[:8]}" for what in ("complete", "silent", "lost")}
    for name in names.values():  # as submit_job does, before each job exists: the tag holds nothing yet
        assert (await acts._record_tag_before("evidence", target, name))["digest"] is None
    out = tmp_path / "build.out"
    out.write_text(_build(_context(tmp_path, files), f"{repo}:{tag}", open_registry.host, tmp_path, megatron="1"))
    assert NOT_MEG in out.read_text() and f"{FINAL} (megatron=0)" in out.read_text()
    scripts = {"complete": f"cat {out}", "silent": "true",
               "lost": f"head -n -2 {out}; seq 1 {BURST}; tail -n 2 {out}"}
    for what, name in names.items():
        await _run_to_end(iris_client, name, f"set -euo pipefail; {scripts[what]}")
        check = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, target))
        assert check.contradicted or check.lost, (what, check)  # never validated
        c = await _capture(acts, name, target, check)
        if what == "complete":
            text = "\n".join(check.contradicted)
            assert f"`{NOT_MEG}` is the branch the plan excludes: the plan expects `{MEG}`" in text, text
            assert f"done (megatron=0)` shows it with another value: the plan expects `{FINAL} (megatron=1)`" in text
            assert "planned INSTALL_MEGATRON=1" in text and check.lost == []
            assert (str(c.failure_class), c.reasons) == ("assertion_failure", check.contradicted)
        else:  # silent, or whatever the store kept: the image itself answers, with the excluded branch
            text = "\n".join(check.contradicted)
            assert f"`{NOT_MEG}` is the branch the plan excludes: the plan expects `{MEG}`" in text, (what, check)
            if what == "silent":
                assert text.startswith(f"running {repo}@sha256:"), text
            assert (str(c.failure_class), c.reasons) == ("assertion_failure", check.contradicted)
            assert MEG not in check.stood_in
        print(f"{what}: {c.failure_class}: {c.reasons[0][:200]}")


async def test_a_job_that_pushed_nothing_adopts_the_older_image_only_where_policy_allows(
        iris_controller, iris_client, open_registry, tmp_path):
    files = fixture_files(HARBOR)
    repo, tag = f"{open_registry.host}/evidence", f"gpu-rl-{uuid.uuid4().hex[:8]}"
    ctx = _context(tmp_path, files)
    _build(ctx, f"{repo}:{tag}", open_registry.host, tmp_path, megatron="0")  # an earlier build of this commit
    out = tmp_path / "nopush.out"
    out.write_text(_build(ctx, f"{repo}:{tag}", open_registry.host, tmp_path, megatron="0", push=False))
    target = _target(files, "standard", repo, tag)
    for allowed in (False, True):
        acts = _acts(tmp_path, iris_controller.url, open_registry.host, allow_adopted_image=allowed)
        name = f"/tester/nopush-{uuid.uuid4().hex[:8]}"
        before = await acts._record_tag_before("evidence", target, name)  # as submit_job does
        assert before["digest"] and before["digest"].startswith("sha256:")
        await _run_to_end(iris_client, name, f"cat {out}")  # complete: every marker, no push
        check = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, target))
        if not allowed:
            assert check.lost and check.lost[0].endswith(
                f"adopted, not built by this job: {before['digest']} was already at {repo}:{tag} before the job "
                "was submitted (policy.allow_adopted_image is false)"), check.lost
            c = await _capture(acts, name, target, check)
            assert str(c.failure_class) == "log_lost"
        else:
            assert (check.lost, check.missing, check.contradicted) == ([], [], []), check
            assert all("adopted, not built by this job" in v for v in check.stood_in.values()) and check.stood_in


async def test_a_good_megatron_image_answers_its_own_import_check_and_a_lost_value_stays_unproven(
        iris_controller, iris_client, open_registry, tmp_path):
    """The fixture's megatron image (no ENV override) and a silent log: the image run proves the branch marker
    from the image's content (its megatron.core import); markers that carry a value (`done (megatron=1)`) are
    proven only by their own line, so the target still ends log_lost, naming them: never a pass on less."""
    acts = _acts(tmp_path, iris_controller.url, open_registry.host)
    files = fixture_files(HARBOR)
    repo, tag = f"{open_registry.host}/evidence", f"gpu-rl-megatron-{uuid.uuid4().hex[:8]}"
    target = _target(files, "megatron", repo, tag)
    name = f"/tester/good-silent-{uuid.uuid4().hex[:8]}"
    assert (await acts._record_tag_before("evidence", target, name))["digest"] is None
    _build(_context(tmp_path, files), f"{repo}:{tag}", open_registry.host, tmp_path, megatron="1")
    await _run_to_end(iris_client, name, "true")
    check = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, target))
    assert check.contradicted == [] and check.lost, check
    assert check.stood_in[MEG].startswith("the image ran its own check: docker/Dockerfile.gpu-rl:"), check.stood_in
    assert f"{FINAL} (megatron=1)" in check.missing and MEG not in check.missing
    assert "carries a value (INSTALL_MEGATRON=1)" in check.lost[0] or any(
        "carries a value" in r for r in check.lost), check.lost


async def test_a_megatron_build_after_a_standard_build_of_the_commit_validates_on_cached_value_steps(
        iris_controller, iris_client, open_registry, tmp_path):
    """The sandbox's amd64 standard then amd64 megatron build of one commit through the shared kaniko cache: the
    base stage is a cache hit, so `base: torch 2.11.0+cu129 index pinned` (an echo of the ARG TORCH_VERSION) is
    never printed again. Its cache key holds the planned TORCH_VERSION: the megatron target validates (on main
    before the cache-proof change it ended log_lost on that marker). The megatron steps ran (another key)."""
    acts = _acts(tmp_path, iris_controller.url, open_registry.host)
    files = fixture_files(HARBOR)
    repo = f"{open_registry.host}/evidence"
    cache = ("--cache=true", f"--cache-repo={open_registry.host}/cache-{uuid.uuid4().hex[:8]}")
    ctx = _context(tmp_path, files)
    std_tag, meg_tag = (f"gpu-rl-{v}{uuid.uuid4().hex[:8]}" for v in ("", "megatron-"))
    _build(ctx, f"{repo}:{std_tag}", open_registry.host, tmp_path, megatron="0", extra=cache)
    target = _target(files, "megatron", repo, meg_tag)
    torch = next(m for m in target.expected_markers if m.name == "base: torch 2.11.0+cu129 index pinned")
    assert torch.cache_proof
    name = f"/tester/cached-megatron-{uuid.uuid4().hex[:8]}"
    assert (await acts._record_tag_before("evidence", target, name))["digest"] is None
    out = tmp_path / "megatron.out"
    out.write_text(_build(ctx, f"{repo}:{meg_tag}", open_registry.host, tmp_path, megatron="1", extra=cache))
    text = out.read_text()
    assert 'Using caching version of cmd: RUN echo "base: torch ${TORCH_VERSION}+cu129 index pinned"' in text
    assert "base: torch 2.11.0" not in text.replace("${TORCH_VERSION}", "")  # never printed by this build
    assert f"{FINAL} (megatron=1)" in text and MEG in text  # the megatron steps ran
    await _run_to_end(iris_client, name, f"cat {out}")
    check = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, target))
    assert (check.lost, check.missing, check.contradicted) == ([], [], []), check
    assert torch.name in check.cached and check.pushed_digest, check
    report = await ActivityEnvironment().run(acts.validate_image, ValidateInput(
        target=target, build_commit=COMMIT, harbor_commit=HARBOR, claimed_digest=check.pushed_digest))
    assert report.ok, report.failure_summary()
