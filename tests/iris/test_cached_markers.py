"""A rebuild whose marker steps kaniko takes from its layer cache, on the real 0.2.227 controller and a real
registry, with the kaniko stand-in's real cache (sandbox/fixtures/marinskyrl/docker/kaniko_standin.py).

The first build of the commit ran every step and pushed each RUN layer to the cache, then pushed no image (a job
cancelled or failed after the marker steps). The rebuild takes every RUN step from the cache: kaniko prints
`Using caching version of cmd: RUN …` instead of the steps' lines. Old code judged that good image `log_lost`
("carries a value", "printed on a branch", and a resume hint that reuses the same cache); now the target ends
``cache_unproven``, each unproven marker naming its cached step, and nothing a cache hit cannot prove passes,
least of all another variant's marker."""

from __future__ import annotations

import uuid

import pytest
from temporalio.testing import ActivityEnvironment

from domain.failures import HINTS, FailureClass
from domain.markers import own_output
from domain.models import CaptureInput
from tests.contract.helpers import DF_AMD, fixture_files
from tests.iris.test_log_evidence import COMMIT, HARBOR, _check_input, _run_to_end
from tests.iris.test_wrong_image import MEG, _acts, _build, _context, _target

pytestmark = pytest.mark.stack

FINAL = "uv sync FINAL (vllm, cufft, triton, nvshmem, nvrtc + closure verify) done"


async def _capture(acts, name, target, check):
    """As workflows/target.py passes a check to capture_failure."""
    captured = await ActivityEnvironment().run(acts.capture_failure, CaptureInput(
        request_id="evidence", job_id=name, cluster="local", target_key=target.key, missing_markers=check.missing,
        log_lost=check.lost, log_lost_cause=check.lost_cause, contradicted=check.contradicted))
    return captured.classification


async def test_a_rebuild_from_the_cache_ends_cache_unproven_naming_each_cached_step(
        iris_controller, iris_client, open_registry, tmp_path):
    acts = _acts(tmp_path, iris_controller.url, open_registry.host)
    files = fixture_files(HARBOR)
    repo = f"{open_registry.host}/evidence"
    cache = ("--cache=true", f"--cache-repo={open_registry.host}/cache-{uuid.uuid4().hex[:8]}")
    ctx = _context(tmp_path, files)
    tag = f"gpu-rl-{uuid.uuid4().hex[:8]}"
    first = _build(ctx, f"{repo}:{tag}", open_registry.host, tmp_path, megatron="0", push=False, extra=cache)
    assert "Pushing layer" in first and "Using caching version" not in first  # every step ran and was cached
    target = _target(files, "standard", repo, tag)
    name = f"/tester/cached-rebuild-{uuid.uuid4().hex[:8]}"
    assert (await acts._record_tag_before("evidence", target, name))["digest"] is None
    out = tmp_path / "rebuild.out"
    out.write_text(_build(ctx, f"{repo}:{tag}", open_registry.host, tmp_path, megatron="0", extra=cache))
    text = out.read_text()
    assert text.count("Using caching version of cmd: RUN") == text.count("Checking for cached layer")
    assert "uv sync layer 0" not in own_output(text)[0]  # kaniko quotes the step; the step printed nothing
    await _run_to_end(iris_client, name, f"cat {out}")
    check = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, target))

    assert check.contradicted == [] and check.lost and check.lost_cause == "cache", check
    assert "uv sync layer 1 (ray, hydra, datasets stack) done" in check.cached  # a fixed echo its step prints
    assert "base: torch 2.11.0+cu129 index pinned" in check.cached  # a keyed ARG value
    assert f"{FINAL} (megatron=0)" in check.cached  # `if …; fi && echo "… (megatron=${INSTALL_MEGATRON})"`
    assert "megatron backend not installed (INSTALL_MEGATRON=0)" in check.cached  # the branch the keyed arg chose
    assert set(check.missing) == set(check.unproven) and check.missing, check
    for m, why in check.unproven.items():
        assert why.startswith(f"unproven (kaniko took its step from the cache: {DF_AMD}:"), (m, why)
    assert set(check.unproven) == {  # computed values, and a branch echo that is not its branch's last statement
        "/opt/skyrl git tree baked @ … (origin=marin-community/MarinSkyRL, source @ " + "1" * 40 + ")",
        "torchtitan ExpertParallel import OK (apply_ep EP>1 unblocked)", "harbor …",
        "pip-check gate OK (… known conflicts, platform=linux_x86_64, megatron=0)"}, check.unproven
    assert "printed on a branch of its step" in check.unproven[
        "torchtitan ExpertParallel import OK (apply_ep EP>1 unblocked)"]
    assert check.lost[0].startswith("kaniko took the steps of "), check.lost
    assert not any("absent from the log" in r for r in check.incomplete), check.incomplete
    c = await _capture(acts, name, target, check)
    print(f"{c.failure_class}: {c.reasons[0]}")
    assert (c.failure_class, c.reasons) == (FailureClass.CACHE_UNPROVEN, check.lost)
    assert c.operator_hint == HINTS[FailureClass.CACHE_UNPROVEN] and "KANIKO_CACHE=0" in c.operator_hint

    # The same build judged for the megatron target (whose image the tag does not hold): never a pass. The log
    # as the script prints it holds its xtrace of the kaniko command, with INSTALL_MEGATRON=0: the hits are of
    # steps run on 0, so no value or branch INSTALL_MEGATRON keys counts for the megatron plan.
    meg_target = _target(files, "megatron", repo, tag)
    traced = tmp_path / "traced.out"
    traced.write_text(f"+ exec python3 /app/docker/kaniko_standin.py --context dir:///app --dockerfile /app/{DF_AMD} "
                      f"--destination {repo}:{tag} --build-arg WHEEL_SOURCE=wheel-builder --build-arg "
                      f"INSTALL_MEGATRON=0 --build-arg GITSHA={COMMIT} --build-arg HARBOR_COMMIT={HARBOR}\n" + text)
    name = f"/tester/cached-traced-{uuid.uuid4().hex[:8]}"
    await _run_to_end(iris_client, name, f"cat {traced}")
    meg = await ActivityEnvironment().run(acts.check_build_log, _check_input(name, meg_target))
    assert meg.contradicted or meg.lost, meg
    keyed = [m.name for m in meg_target.expected_markers if m.cache_proof and "INSTALL_MEGATRON" in m.cache_vars]
    assert f"{FINAL} (megatron=1)" in keyed and "FSDP torchtitan backend not installed (INSTALL_MEGATRON=1)" in keyed
    assert not set(keyed) & set(meg.cached) and MEG not in meg.cached and MEG not in meg.stood_in, meg
    assert "the log's traced kaniko command passes INSTALL_MEGATRON=0 where the plan says INSTALL_MEGATRON=1" in \
        meg.unproven.get(f"{FINAL} (megatron=1)", "") or meg.contradicted, meg
