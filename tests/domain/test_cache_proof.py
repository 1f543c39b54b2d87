"""A kaniko cache hit proves a value marker only where its cache key holds the planned values (issue #34 follow-up).

kaniko caches a RUN step only after it exited 0, under a key of the step's text and every build arg and ENV value
in force there; so the reused layer's step printed what this build's would, where the values it prints are ARGs of
its stage with the values we plan and no ENV overrides them. A megatron build after a standard build of the same
commit reuses the shared base stage: `base: torch 2.11.0+cu129 index pinned` is a cache hit, never printed again.
"""

from __future__ import annotations

from domain.log_evidence import ImageFacts, LogIntegrity, cached_values_confirmed, judge
from domain.markers import CACHE_HIT, Marker, check_log, expected_markers
from tests.contract.helpers import COMMIT, DF_AMD, contract, edited

REPO = "registry.local/marinskyrl"
TAG = f"gpu-rl-megatron-{COMMIT}"
TORCH = "base: torch 2.11.0+cu129 index pinned"
TORCH_STEP = 'RUN echo "base: torch ${TORCH_VERSION}+cu129 index pinned"'
PUSH = f"INFO[0009] Pushing image to {REPO}:{TAG}\nINFO[0010] Pushed {REPO}@sha256:{'ab' * 32}\n"


def _markers(files=None, variant="megatron") -> list[Marker]:
    return expected_markers(contract(files), "amd64", variant, "wheel-builder", TAG, image_repository=REPO)


def _log_with_cache_hit(markers: list[Marker], cached: str, step: str) -> str:
    """Every marker printed except ``cached``, whose step kaniko reused (as kaniko logs it)."""
    own = "".join((m.text or m.name.replace("…", "3")) + "\n" for m in markers
                  if m.role == "assert" and m.name != cached)
    return f"INFO[0002] {CACHE_HIT.removesuffix(' RUN')} {step}\n" + own + PUSH


def _judged(markers: list[Marker], log: str):
    check = check_log(markers, log)
    return check, judge(markers, check, LogIntegrity(lines=len(log.splitlines())), None)


def test_a_cached_value_step_with_the_planned_args_proves_its_marker():
    """Fails on main before this change: the cached `base: torch …` marker stayed missing and the target ended
    log_lost (the sandbox's amd64 megatron build after the standard one)."""
    markers = _markers()
    torch = next(m for m in markers if m.name == TORCH)
    assert torch.values == {"TORCH_VERSION": "2.11.0"} and torch.cache_proof
    check, j = _judged(markers, _log_with_cache_hit(markers, TORCH, TORCH_STEP))
    assert check.cached == [TORCH] and not check.missing and j.verdict == "log", (check, j)


def test_a_cache_hit_of_another_step_proves_nothing():
    markers = _markers()
    other = TORCH_STEP.replace("index pinned", "index staged")
    check, j = _judged(markers, _log_with_cache_hit(markers, TORCH, other))
    assert check.missing == [TORCH] and j.verdict == "log_lost"


def test_an_env_over_the_printed_arg_keeps_the_cached_marker_unproven():
    """ENV wins over ARG: the key holds the ENV value, not the planned one; the cache hit proves nothing."""
    for before in ("ENV TORCH_VERSION=2.10.0\nRUN echo \"base: torch ${TORCH_VERSION}+cu129 index pinned\"\n",):
        files = edited(DF_AMD, lambda t, b=before: t.replace(
            'RUN echo "base: torch ${TORCH_VERSION}+cu129 index pinned"\n', b))
        markers = _markers(files)
        torch = next(m for m in markers if m.name == TORCH)
        assert not torch.cache_proof
        check, j = _judged(markers, _log_with_cache_hit(markers, TORCH, TORCH_STEP))
        assert check.missing == [TORCH] and not check.cached and j.verdict == "log_lost", (check, j)


def test_an_env_in_an_earlier_stage_keeps_the_cached_marker_unproven():
    """`ENV INSTALL_MEGATRON=0` in the base stage: the rl stage inherits it; a cached megatron value step (the
    wrong image's) is not proof of `megatron=1`."""
    step = 'RUN echo "megatron knob ${INSTALL_MEGATRON} staged"'
    files = edited(DF_AMD, lambda t: t.replace("FROM base AS rl\n", "FROM base AS rl\n").replace(
        'RUN echo "boto3 s3', f'{step}\nRUN echo "boto3 s3'))
    good = next(m for m in _markers(files) if m.name == "megatron knob 1 staged")
    assert good.cache_proof  # the control: the ARG the job passes, no ENV
    files = edited(DF_AMD, lambda t: t.replace("ENV PYTHONUNBUFFERED=1\n", "ENV PYTHONUNBUFFERED=1\nENV INSTALL_MEGATRON=0\n"),
                   files)
    markers = _markers(files)
    knob = next(m for m in markers if m.name == "megatron knob 1 staged")
    assert not knob.cache_proof
    check, j = _judged(markers, _log_with_cache_hit(markers, knob.name, step))
    assert knob.name in check.missing and knob.name not in check.cached and j.verdict == "log_lost"


def test_a_conditional_or_command_substituted_value_echo_cached_stays_lost():
    """A branch whose test reads an ARG the step's stage does not declare (its RUN env has no such value: the
    key does not hold the one the plan read) or a `$(...)`: the cache hit proves neither."""
    cond = ('RUN if [ -n "$FLASH_ATTN_VERSION" ]; then echo "base: torch ${TORCH_VERSION}+cu129 index pinned"; '
            'fi')
    subst = 'RUN echo "base: torch ${TORCH_VERSION}+cu129 index pinned on $(uname -m)"'
    for step in (cond, subst):
        # FLASH_ATTN_VERSION: a global pin the base stage does not declare (the plan reads the pin's value)
        files = edited(DF_AMD, lambda t, s=step: t.replace(TORCH_STEP + "\n", s + "\n"))
        markers = _markers(files)
        torch = next(m for m in markers if m.name.startswith(TORCH))
        assert not torch.cache_proof and (torch.conditional or torch.pattern is not None), step
        check, j = _judged(markers, _log_with_cache_hit(markers, torch.name, step))
        assert check.missing == [torch.name] and j.verdict == "log_lost", (step, check)


def test_a_branch_its_keyed_args_force_is_proven_by_a_cache_hit_of_its_step():
    """`if [ -n "$TORCH_VERSION" ]; then echo …; fi` as the step: the key holds TORCH_VERSION=2.11.0, so the
    reused layer's step took that branch, and its zero exit ran the branch's echo. Not where the echo is not the
    branch's last statement (`echo …; false || true` exits 0 whatever ran before), nor after an `exit 0` that
    may end the step first."""
    step = 'RUN if [ -n "$TORCH_VERSION" ]; then echo "base: torch ${TORCH_VERSION}+cu129 index pinned"; fi'
    files = edited(DF_AMD, lambda t: t.replace(TORCH_STEP + "\n", step + "\n"))
    markers = _markers(files)
    torch = next(m for m in markers if m.name == TORCH)
    assert torch.conditional and torch.cache_proof and torch.cache_vars == {"TORCH_VERSION": "2.11.0"}
    check, j = _judged(markers, _log_with_cache_hit(markers, TORCH, step))
    assert check.cached == [TORCH] and j.verdict == "log", (check, j)
    for bad in ('RUN if [ -n "$TORCH_VERSION" ]; then echo "base: torch ${TORCH_VERSION}+cu129 index pinned"; '
                'false || true; fi',
                'RUN if [ -n "$TORCH_VERSION" ]; then exit 0; fi; echo "base: torch ${TORCH_VERSION}+cu129 index '
                'pinned"'):
        files = edited(DF_AMD, lambda t, b=bad: t.replace(TORCH_STEP + "\n", b + "\n"))
        markers = _markers(files)
        torch = next(m for m in markers if m.name == TORCH)
        assert not torch.cache_proof and not torch.must_run, bad
        check, j = _judged(markers, _log_with_cache_hit(markers, TORCH, bad))
        assert check.missing == [TORCH] and TORCH in check.cache_unproven and j.verdict == "log_lost", (bad, check)


def test_an_arg_default_applies_to_its_own_stage_only():
    """A later stage's `ARG TORCH_VERSION=2.9.0` does not change what the base stage printed (the pin it imports);
    an arg the stage does not declare before the step is not in its key; a value the script passes that we do not
    plan is not known."""
    files = edited(DF_AMD, lambda t: t.replace("ARG FLASH_ATTN_VERSION\nLABEL",
                                               "ARG FLASH_ATTN_VERSION\nARG TORCH_VERSION=2.9.0\nLABEL"))
    markers = _markers(files)
    torch = next(m for m in markers if m.name == TORCH)  # on main: `base: torch 2.9.0+cu129 …`
    assert torch.cache_proof
    late = edited(DF_AMD, lambda t: t.replace("ARG TORCH_VERSION\nENV", "ENV").replace(
        TORCH_STEP + "\n", TORCH_STEP + "\nARG TORCH_VERSION\n"))
    assert not any(m.cache_proof for m in _markers(late) if m.name.startswith("base: torch"))
    script = "docker/build_gpu_rl_kaniko.sh"
    passed = edited(script, lambda t: t.replace('--build-arg "GITSHA=$GITSHA"',
                                                '--build-arg "GITSHA=$GITSHA"\n  --build-arg "TORCH_VERSION=$T"'))
    assert contract(passed).script.build_args is not None
    assert not next(m for m in _markers(passed) if m.name == TORCH).cache_proof
    varies = edited(script, lambda t: t.replace('--build-arg "GITSHA=$GITSHA"',
                                                '--build-arg "GITSHA=$GITSHA"\n  --build-arg "TORCH_VERSION=2.9.0"'
                                                '\n  --build-arg "TORCH_VERSION=$TORCH_VERSION"'))
    assert contract(varies).script.build_args["TORCH_VERSION"] == "<varies>"
    assert not next(m for m in _markers(varies) if m.name == TORCH).cache_proof
    same = edited(script, lambda t: t.replace('--build-arg "GITSHA=$GITSHA"',
                                              '--build-arg "GITSHA=$GITSHA"\n  --build-arg "TORCH_VERSION=$TORCH_VERSION"'))
    assert next(m for m in _markers(same) if m.name == TORCH).cache_proof  # the pin the loop set, passed as is
    unnamed = edited(script, lambda t: t.replace('--build-arg "GITSHA=$GITSHA"',
                                                 '--build-arg "GITSHA=$GITSHA"\n  --build-arg "$EXTRA"'))
    assert contract(unnamed).script.build_args is None
    assert not next(m for m in _markers(unnamed) if m.name == TORCH).cache_proof


def test_a_step_text_held_by_two_run_steps_is_not_proven_by_a_cache_hit():
    """The wheel-builder stage (built too, not in the target's chain) echoes the same text: a hit may be its."""
    files = edited(DF_AMD, lambda t: t.replace('RUN echo "built vllm wheel', TORCH_STEP + '\nRUN echo "built vllm wheel'))
    torch = next(m for m in _markers(files) if m.name == TORCH)
    assert not torch.cache_proof


def _facts(env_keys: list[str], built: bool | None = True, present: bool = True) -> ImageFacts:
    return ImageFacts(ref=f"{REPO}:{TAG}", digest="sha256:" + "ab" * 32, ours=True, built_by_job=built,
                      env_keys=env_keys, env_present=present)


def test_a_base_image_env_of_the_printed_name_takes_the_cache_proof_back():
    """The Dockerfile shows no ENV TORCH_VERSION, but the base image may set one (nvidia/cuda sets CUDA_VERSION):
    ENV wins over the ARG, so the cached step printed that value. The image this job pushed says: its config Env
    holds every ENV in force along its chain. Not read, or not this job's image: the proof is taken back too."""
    markers = _markers()
    check = check_log(markers, _log_with_cache_hit(markers, TORCH, TORCH_STEP))
    assert check.cached == [TORCH]
    ok = cached_values_confirmed(markers, check, _facts(["PATH", "CUDA_VERSION", "PYTHONUNBUFFERED"]))
    assert ok.cached == [TORCH] and not ok.missing
    for facts in (_facts(["PATH", "TORCH_VERSION"]), _facts([], built=None), _facts([], built=False),
                  _facts([], present=False), None):
        back = cached_values_confirmed(markers, check, facts)
        assert back.cached == [] and back.missing == [TORCH], facts
        assert judge(markers, back, LogIntegrity(lines=9), None).verdict == "log_lost"
    fixed = [m for m in markers if m.name == "base: python 3.12 toolchain and uv staged"]
    log = f'INFO[0002] {CACHE_HIT} echo "base: python 3.12 toolchain and uv staged"\n'
    assert cached_values_confirmed(fixed, check_log(fixed, log), None).cached == [fixed[0].name]  # fixed text
