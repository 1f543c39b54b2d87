"""Marker steps kaniko takes from its layer cache (`Using caching version of cmd: RUN …`): the step did not run in
this build, so its lines are not in this log. The verdict says so per marker (its step, file:line, and why the hit
cannot prove it) instead of a generic lost log, and a hit never proves more than its step always prints."""

from __future__ import annotations

import dockerfile
import pytest

from domain.log_evidence import ImageFacts, LogIntegrity, judge
from domain.markers import check_log, expected_markers
from tests.contract.helpers import COMMIT, DF_AMD, contract, edited
from tests.contract.real import line_in, real_contract, real_tree

REPO = "registry.local/marinskyrl"
PUSH = f"INFO[0009] Pushing image to {REPO}:TAG\nINFO[0010] Pushed {REPO}@sha256:{'ab' * 32}\n"


def _cache_log(text: str, *, upto: str | None = None) -> str:
    """kaniko's log of a rebuild whose RUN steps (up to the one holding ``upto``) are cache hits: each quoted as
    kaniko quotes it (the instruction as written, continuation lines joined: buildkit's `Original`)."""
    out = []
    for c in dockerfile.parse_string(text):
        if c.cmd.upper() != "RUN":
            continue
        out.append(f"\x1b[36mINFO\x1b[0m[0012] Using caching version of cmd: {c.original}\n")
        if upto and upto in c.original:
            break
    return "".join(out)


def _ours(ref: str, env_keys=("PATH", "NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION")) -> ImageFacts:
    return ImageFacts(ref=ref, digest="sha256:" + "ab" * 32, ours=True, history=["RUN x"], history_present=True,
                      built_by_job=True, built_why="the log shows this job pushed it", env_keys=list(env_keys),
                      env_present=True)


@pytest.mark.parametrize("variant,env", [("standard", {}), ("megatron", {"INSTALL_MEGATRON": "1"})])
def test_a_rebuild_of_the_real_era_c_dockerfile_from_the_cache_names_each_cached_step(tmp_path, variant, env):
    """The real era-C Dockerfile, every marker step a cache hit (a rebuild after a late failure or a cancel): the
    fixed echoes of each step's final `&&` chain, the ARG-keyed `(megatron=N)` and harbor commit values, and the
    echo of the `if [ "${INSTALL_MEGATRON}" = … ]` branch the keyed INSTALL_MEGATRON chose are proven by the hits;
    every other marker is unproven, naming its cached step (file:line) and why. Old code: a cached step's marker
    was a generic `log_lost` ("carries a value", "printed on a branch"), never naming the cache, and it counted a
    hit for the fixed `memray OK` / `boto3 s3 client ctor OK` lines, whose steps can exit 0 without printing them."""
    c = real_contract(tmp_path, "era-c")
    text = (real_tree("era-c") / DF_AMD).read_text()
    markers = [m for m in expected_markers(c, "amd64", variant, "prebuilt-wheelhouse", "TAG", image_repository=REPO,
                                           job_env=env) if m.source != "script"]
    check = check_log(markers, _cache_log(text) + PUSH)
    megatron = "1" if variant == "megatron" else "0"
    layers = [m.name for m in markers if m.name.startswith("uv sync ")]
    assert len(layers) == 10 and f"uv sync FINAL (vllm, cufft, triton, nvshmem, nvrtc + closure verify) done " \
        f"(megatron={megatron})" in layers
    harbor = next(m.name for m in markers if m.name.startswith("baked harbor commit: "))
    echo = ("FSDP torchtitan backend not installed (INSTALL_MEGATRON=1)" if variant == "megatron" else
            "megatron backend not installed (INSTALL_MEGATRON=0)")
    # fixed echoes, the keyed INSTALL_MEGATRON and HARBOR_COMMIT values, the else-branch echo the key chose
    assert check.cached == [*layers, echo, harbor]
    asserts = [m for m in markers if m.role == "assert"]
    assert set(check.cache_unproven) == {m.name for m in asserts} - set(check.cached)
    memray = check.cache_unproven["memray OK"]
    line = line_in("era-c", DF_AMD, "RUN uv pip install --python ${RL_ENV_DIR}/bin/python cloudpickle")
    assert memray.startswith(f"unproven (kaniko took its step from the cache: {DF_AMD}:{line + 3}, `RUN uv pip "
                             "install --python ${RL_ENV_DIR}/bin/python cloudpickle"), memray
    assert memray.endswith("its step can exit 0 without printing it, as far as the service reads the step (it "
                           "is not an unguarded `echo` of the step's final `&&` chain)")
    branch = "Megatron native imports OK" if variant == "megatron" else \
        "torchtitan ExpertParallel import OK (apply_ep EP>1 unblocked)"  # a python print: exit 0 proves no print
    assert "printed on a branch of its step" in check.cache_unproven[branch]
    assert "holds a value the step computes" in check.cache_unproven["harbor …"]

    j = judge(markers, check, LogIntegrity(lines=60), _ours(f"{REPO}:TAG"))
    assert j.verdict == "log_lost" and j.cause == "cache", j
    assert set(j.unproven) == set(check.cache_unproven) and set(j.from_cache) == set(j.unproven)
    assert all(why.startswith("unproven (kaniko took its step from the cache: docker/Dockerfile.gpu-rl:")
               for why in j.unproven.values()), j.unproven
    assert j.reasons[0].startswith(f"kaniko took the steps of {len(j.unproven)} marker(s) from its cache, so this "
                                   f"build never printed them, and neither that cache hit nor the image {REPO}:TAG@")
    assert not any("absent from the log" in r for r in j.incomplete), j.incomplete  # nothing the store lost


def test_a_cache_hit_never_proves_a_line_its_step_can_skip(tmp_path):
    """`|| true` after a check: the step exits 0 (and kaniko caches its layer) whether or not the check printed.
    Old code counted the hit for this fixed, unguarded-looking line: a false pass."""
    check_line = "python3 -c \"import boto3; print('boto3 s3 client ctor OK')\""
    files = edited(DF_AMD, lambda t: t.replace('RUN echo "boto3 s3 client ctor OK (compute_endpoint_resolver skew '
                                               'cleared)"', f"RUN {check_line} || true"))
    markers = expected_markers(contract(files, commit=COMMIT), "amd64", "standard", "wheel-builder", "TAG",
                               image_repository=REPO)
    boto = next(m for m in markers if m.name == "boto3 s3 client ctor OK")
    assert not boto.conditional and not boto.carries_value and not boto.must_run
    check = check_log(markers, _cache_log(files[DF_AMD]) + PUSH)
    assert boto.name in check.missing and boto.name not in check.cached
    assert "its step can exit 0 without printing it" in check.cache_unproven[boto.name]


def test_a_cache_hit_of_the_other_variants_step_proves_nothing(tmp_path):
    """A Dockerfile whose megatron and standard steps differ in text: the standard build's cache hits are other
    steps than the megatron plan's, so a megatron target whose log lost its own line is not proven by them."""
    files = edited(DF_AMD, lambda t: t.replace('RUN echo "uv sync layer 3 (training extras) done"',
                                               'RUN echo "uv sync layer 3 (training extras) done (megatron=0)"'))
    meg_files = edited(DF_AMD, lambda t: t.replace('RUN echo "uv sync layer 3 (training extras) done"',
                                                   'RUN echo "uv sync layer 3 (training extras) done (megatron=1)"'))
    markers = expected_markers(contract(meg_files, commit=COMMIT), "amd64", "megatron", "wheel-builder", "TAG",
                               image_repository=REPO)
    name = "uv sync layer 3 (training extras) done (megatron=1)"
    assert any(m.name == name for m in markers)
    log = _cache_log(files[DF_AMD]).replace("megatron=0", "megatron=1 ") + PUSH  # near, not equal
    check = check_log(markers, log)
    assert name in check.missing and name not in check.cached and name not in check.cache_unproven
    check = check_log(markers, _cache_log(meg_files[DF_AMD]) + PUSH)  # its own step: fixed text, always printed
    assert name in check.cached


def test_cached_steps_classify_as_cache_unproven_with_the_cache_bypass_and_the_report_names_each_step():
    from domain.failures import HINTS, Evidence, FailureClass, classify, decide_retry
    from domain.models import FileRef, LogCheck
    from domain.outcome import targets_failure
    from domain.report import log_evidence_lines
    from domain.request import BuildRequest

    why = "kaniko took the steps of 1 marker(s) from its cache, so this build never printed them, and ..."
    c = classify(Evidence(job_state="succeeded", missing_markers=["m"], log_lost=[why], log_lost_cause="cache"))
    assert (c.failure_class, c.reasons) == (FailureClass.CACHE_UNPROVEN, [why])
    assert "KANIKO_CACHE=0" in c.operator_hint and "clusters.<name>.job_env" in c.operator_hint
    assert decide_retry(c, {}, {"cache_unproven": 3}) == "fail"  # the same cache would answer the same
    lost = classify(Evidence(job_state="succeeded", missing_markers=["m"], log_lost=[why]))
    assert lost.failure_class is FailureClass.LOG_LOST and lost.operator_hint == HINTS[FailureClass.LOG_LOST]

    step = "unproven (kaniko took its step from the cache: docker/Dockerfile.gpu-rl:72, `RUN if …`): a branch"
    check = LogCheck(log=FileRef(uri="file:///x.log", sha256="0" * 64, size_bytes=1), found=[], missing=["m"],
                     final_push_seen=True, pushed_digest=None, incomplete=["kaniko took the steps of 1 marker(s)"],
                     lost=[why], unproven={"m": step}, lost_cause="cache")
    lines = log_evidence_lines("amd64-standard", check, inert=lambda s: s)
    assert f"  - m: {step}" in lines, lines
    req = BuildRequest(architectures=["amd64"], compatibility_request=None)
    assert "resume WID" in targets_failure(["x"], ["cache_unproven"], req, "WID").next_step


def test_a_traced_kaniko_command_with_other_build_args_takes_the_keyed_proof_back():
    """The cache key holds what kaniko was given. The script's xtrace of its kaniko command (`set -x`: both eras
    and the fixture) shows that: a megatron plan judged on a log whose kaniko got INSTALL_MEGATRON=0 proves none
    of the values or branches INSTALL_MEGATRON keys, however the cache lines read; the planned value does."""
    files = __import__("tests.contract.helpers", fromlist=["fixture_files"]).fixture_files()
    markers = expected_markers(contract(files, commit=COMMIT), "amd64", "megatron", "wheel-builder", "TAG",
                               image_repository=REPO)
    keyed = [m.name for m in markers if m.cache_proof and "INSTALL_MEGATRON" in m.cache_vars]
    assert "FSDP torchtitan backend not installed (INSTALL_MEGATRON=1)" in keyed and \
        "uv sync FINAL (vllm, cufft, triton, nvshmem, nvrtc + closure verify) done (megatron=1)" in keyed
    cached = _cache_log(files[DF_AMD]) + PUSH

    def xtrace(megatron: str) -> str:
        return ("[/u/job/0:0 stderr] + BUILD_ARGS=(--build-arg 'WHEEL_SOURCE=wheel-builder' --build-arg "
                "'INSTALL_MEGATRON=9')\n"  # an assignment, not the kaniko command
                "[/u/job/0:0 stderr] + exec python3 /app/docker/kaniko_standin.py --context dir:///app --dockerfile "
                f"/app/{DF_AMD} --destination {REPO}:TAG --custom-platform linux/amd64 --cache=true --cache-repo "
                f"{REPO}/cache --build-arg WHEEL_SOURCE=wheel-builder --build-arg INSTALL_MEGATRON={megatron} "
                f"--build-arg GITSHA={COMMIT}\n")

    assert set(keyed) <= set(check_log(markers, cached).cached)  # no trace: the plan's args
    assert set(keyed) <= set(check_log(markers, xtrace("1") + cached).cached)
    check = check_log(markers, xtrace("0") + cached)
    assert not set(keyed) & set(check.cached)
    for name in keyed:
        assert check.cache_unproven[name].endswith(
            "the log's traced kaniko command passes INSTALL_MEGATRON=0 where the plan says INSTALL_MEGATRON=1: the "
            "hit is of a step run on those values"), check.cache_unproven[name]
    assert "uv sync layer 1 (ray, hydra, datasets stack) done" in check.cached  # a fixed echo needs no arg
