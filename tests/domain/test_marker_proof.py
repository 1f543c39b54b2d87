"""A marker is proven only by the build's own output (issue #34 item 1): never by kaniko's echo of a command, its
cache lines, or the text of a history step; a marker that carries a value must show the planned value, and a
line showing another value, or the branch the plan excludes, fails as an assertion naming the line."""

from __future__ import annotations

import re

from domain.failures import Evidence, FailureClass, classify
from domain.log_evidence import ImageFacts, LogIntegrity, judge
from domain.markers import DIGEST_RE, Marker, check_log, expected_markers
from tests.contract.helpers import COMMIT, DF_AMD, contract, edited

REPO = "registry.local/marinskyrl"
TAG = f"gpu-rl-megatron-{COMMIT}"
MEG = "Megatron native imports OK"
FINAL1 = "uv sync FINAL (vllm, cufft, triton, nvshmem, nvrtc + closure verify) done (megatron=1)"
PUSH = f"INFO[0009] Pushing image to {REPO}:{TAG}\nINFO[0010] Pushed {REPO}@sha256:{'ab' * 32}\n"
BRANCH_RUN = next(line for line in (contract().dockerfiles[DF_AMD].final_stage.echoes) if line.template == MEG).step


def _megatron(files=None) -> list[Marker]:
    return expected_markers(contract(files), "amd64", "megatron", "wheel-builder", TAG, image_repository=REPO)


def _ours(history: list[str]) -> ImageFacts:
    return ImageFacts(ref=f"{REPO}:{TAG}", digest="sha256:" + "ab" * 32, ours=True, history=history, built_by_job=True,
                      history_present=bool(history))


def _own_lines(markers: list[Marker], edit=lambda s: s) -> str:
    return "".join(edit(m.text or m.name.replace("…", "3")) + "\n" for m in markers if m.role == "assert")


def test_kaniko_echo_and_cache_lines_are_not_the_build_output():
    markers = _megatron()
    meg = next(m for m in markers if m.name == MEG)
    # kaniko quotes the command (both branches) and its cache misses; the step itself printed nothing we kept
    log = (f"INFO[0003] RUN {BRANCH_RUN.removeprefix('RUN ')}\n"
           f"INFO[0003] No cached layer found for cmd RUN {BRANCH_RUN.removeprefix('RUN ')}\n"
           f'\x1b[36mINFO\x1b[0m[0004] Args: [-c echo "{MEG}"]\n'
           f'+ echo "{MEG}"\n' + PUSH)
    check = check_log(markers, log)
    assert meg.name in check.missing and meg.name not in check.found and meg.name not in check.cached
    assert not check.contradicted  # kaniko's quote of the excluded branch is not output either


def test_a_cache_hit_proves_only_a_fixed_unconditional_line():
    """Only a hit of the marker's own step counts (old code: any cache line holding the echo text, so
    `RUN if x; then echo "uv sync layer 1 done"; fi` proved the unguarded marker); a hit of its own step proves a
    fixed echo its step always prints, never a branch or a line its step may skip."""
    markers = _megatron()
    fixed = next(m for m in markers if m.name == "uv sync layer 1 (ray, hydra, datasets stack) done")
    value = next(m for m in markers if m.name == FINAL1)
    branch = next(m for m in markers if m.name == MEG)
    wrapped = "".join(f"INFO[0003] Using caching version of cmd: RUN if x; then echo \"{m.template}\"; fi\n"
                      for m in (fixed, value, branch))
    check = check_log([fixed, value, branch], wrapped)
    assert check.cached == [] and check.missing == [fixed.name, value.name, branch.name]
    own = "".join(f"INFO[0003] Using caching version of cmd: {c.original}\n" for c in _runs(contract_files()))
    check = check_log([fixed, value, branch], own)
    # `if …; fi && echo "… (megatron=${INSTALL_MEGATRON})"`: the zero exit ran the echo, the key holds the value;
    # the branch's `python3 -c "…print('Megatron native imports OK')"` may exit 0 without printing it
    assert check.cached == [fixed.name, value.name] and check.missing == [branch.name]
    assert check.cache_unproven[branch.name].startswith(
        f"unproven (kaniko took its step from the cache: {DF_AMD}:{branch.line}, `RUN if ")
    assert "printed on a branch of its step" in check.cache_unproven[branch.name]


def contract_files():
    from tests.contract.helpers import fixture_files

    return fixture_files()


def _runs(files):
    import dockerfile

    return [c for c in dockerfile.parse_string(files[DF_AMD]) if c.cmd.upper() == "RUN"]


def test_a_complete_log_with_another_value_or_the_excluded_branch_is_an_assertion_failure():
    """The megatron target whose Dockerfile gained `ENV INSTALL_MEGATRON=0`: the plan still says megatron=1
    (the ARG the job passes), the build printed the standard branch."""
    files = edited(DF_AMD, lambda t: t.replace("FROM base AS rl\n", "FROM base AS rl\nENV INSTALL_MEGATRON=0\n"))
    markers = _megatron(files)
    log = _own_lines(markers, lambda s: s.replace("megatron=1", "megatron=0").replace(
        MEG, "megatron backend not installed (INSTALL_MEGATRON=0)")) + PUSH
    check = check_log(markers, log)
    assert FINAL1 in check.missing and MEG in check.missing
    text = "\n".join(check.contradicted)
    assert "`megatron backend not installed (INSTALL_MEGATRON=0)` is the branch the plan excludes: the plan " \
           f"expects `{MEG}`" in text, text
    assert re.search(r"log line \d+: `uv sync FINAL .* done \(megatron=0\)` shows it with another value: the plan "
                     r"expects `uv sync FINAL .* done \(megatron=1\)` \(docker/Dockerfile.gpu-rl:\d+, planned "
                     r"INSTALL_MEGATRON=1\)", text), text
    j = judge(markers, check, LogIntegrity(lines=len(log.splitlines())), _ours(["RUN whatever"]))
    assert j.verdict == "contradicted" and j.contradicted == check.contradicted
    c = classify(Evidence(job_state="succeeded", missing_markers=j.missing, contradicted=j.contradicted))
    assert c.failure_class is FailureClass.ASSERTION_FAILURE and c.reasons == check.contradicted


def _history_of(files) -> list[str]:
    """What kaniko's config history records for the fixture Dockerfile: each RUN instruction as written."""
    import dockerfile

    return [c.original for c in dockerfile.parse_string(files[DF_AMD]) if c.cmd.upper() == "RUN"]


def test_a_silent_or_lost_log_never_passes_on_history_text_or_a_value():
    files = edited(DF_AMD, lambda t: t.replace("FROM base AS rl\n", "FROM base AS rl\nENV INSTALL_MEGATRON=0\n"))
    markers = _megatron(files)
    history = _history_of(files)  # holds every marker's template, `(megatron=${INSTALL_MEGATRON})` included
    assert any(f"print('{MEG}')" in h for h in history)
    for what, log, lines in (("silent", "", 0), ("lost", "\n".join(map(str, range(10_000))) + "\n" + PUSH, 10_002)):
        check = check_log(markers, log)
        j = judge(markers, check, LogIntegrity(lines=lines), _ours(history))
        assert j.verdict == "log_lost", (what, j.stood_in)
        assert FINAL1 in j.missing and MEG in j.missing, what
        assert "carries a value (INSTALL_MEGATRON=1)" in j.unproven[FINAL1]
        assert "printed on a branch" in j.unproven[MEG]
        assert MEG not in j.stood_in and FINAL1 not in j.stood_in


def test_a_commented_out_echo_in_the_history_step_proves_nothing():
    """The plan's step prints the marker; the image's step holds the echo only in a comment."""
    markers = _megatron()
    boto = next(m for m in markers if m.name.startswith("boto3 s3 client ctor OK"))
    assert boto.must_run and not boto.carries_value and boto.step
    history = [f"RUN true # {boto.template}", f"RUN true && \\\n  # {boto.template}\n  true"]
    j = judge([boto], check_log([boto], ""), LogIntegrity(lines=0), _ours(history))
    assert j.verdict == "log_lost" and j.missing == [boto.name], j
    # the very step (kaniko records the instruction as written) proves the fixed, unguarded echo ran
    j = judge([boto], check_log([boto], ""), LogIntegrity(lines=0), _ours(["COPY x /", boto.step]))
    assert j.verdict == "image" and "is a step of the image" in j.stood_in[boto.name]


def test_pushed_lines_are_kaniko_lines_and_still_prove_the_push():
    m = [Marker(name=f"push {REPO}:{TAG}", text=f"Pushing image to {REPO}:{TAG}", source="kaniko", role="push"),
         Marker(name=f"pushed {REPO}@sha256", pattern=re.escape(f"Pushed {REPO}@") + DIGEST_RE, source="kaniko",
                role="pushed")]
    check = check_log(m, PUSH)
    assert check.final_push_seen and check.pushed_digest == "sha256:" + "ab" * 32


def test_an_image_this_job_did_not_push_is_adopted_and_passes_only_where_policy_allows():
    """Issue #34 item 3: a job that pushed nothing while an earlier image of the commit sat at the tag."""
    from domain.log_evidence import built_by_job

    d, other = "sha256:" + "ab" * 32, "sha256:" + "cd" * 32
    before = {"ref": f"{REPO}:{TAG}", "digest": d, "known": True, "read_at_ms": 1_700_000_000_000}
    built, why = built_by_job(digest=d, platform_digest=None, pushed=None, before=before)
    assert built is False and why == f"{d} was already at {REPO}:{TAG} before the job was submitted"
    assert built_by_job(digest=d, platform_digest=None, pushed=None, before={**before, "digest": other})[0] is True
    assert built_by_job(digest=d, platform_digest=None, pushed=None, before={**before, "digest": None})[0] is True
    assert built_by_job(digest=d, platform_digest=None, pushed=d, before=before)[0] is True  # its own Pushed line
    assert built_by_job(digest=d, platform_digest=None, pushed=other, before=None)[0] is False
    unknown = {"ref": "x", "known": False, "note": "401", "read_at_ms": 1_700_000_000_000}
    assert built_by_job(digest=d, platform_digest=None, pushed=None, before=unknown,
                        created="1970-01-01T00:00:00Z")[0] is None
    assert built_by_job(digest=d, platform_digest=None, pushed=None, before=unknown,
                        created="2026-12-06T05:00:00Z")[0] is True
    assert built_by_job(digest=d, platform_digest=None, pushed=None, before=None)[0] is None

    boto = next(m for m in _megatron() if m.name.startswith("boto3 s3 client ctor OK"))
    push = [m for m in _megatron() if m.role != "assert"]
    markers = [boto, *push]
    history = [boto.step]
    check = check_log(markers, boto.text + "\n")  # complete, and no push: the job pushed nothing
    image = ImageFacts(ref=f"{REPO}:{TAG}", digest=d, ours=True, history=history, history_present=True,
                       built_by_job=False, built_why=why)
    j = judge(markers, check, LogIntegrity(lines=1), image)
    assert j.verdict == "log_lost" and set(j.missing) == {m.name for m in push}
    assert j.reasons[0] == (f"the image {REPO}:{TAG}@{d} cannot stand in for the lost log: adopted, not built by "
                            f"this job: {why} (policy.allow_adopted_image is false)")
    j = judge(markers, check, LogIntegrity(lines=1), image.model_copy(update={"adoption_allowed": True}))
    assert j.verdict == "image" and all("adopted, not built by this job" in j.stood_in[m.name] for m in push)
    j = judge(markers, check, LogIntegrity(lines=1), image.model_copy(update={"built_by_job": None,
                                                                              "built_why": "no record"}))
    assert j.verdict == "log_lost" and "cannot tell whether this job pushed it: no record" in j.reasons[0]


def test_the_image_run_proves_only_what_the_image_printed_and_its_excluded_branch_fails():
    """Issue #34 item 2 (pure part): the script that runs a check step in the image, and how its output is read."""
    import subprocess

    from domain.log_evidence import image_check_script, image_check_steps, read_image_run, with_image_run

    markers = _megatron()
    meg = next(m for m in markers if m.name == MEG)
    assert meg.check_step and meg.step_env == {"INSTALL_MEGATRON": "1"}
    final = next(m for m in markers if m.name == FINAL1)
    assert not final.check_step  # an echo of a value we would pass ourselves proves nothing about the image
    check = check_log(markers, "")
    j = judge(markers, check, LogIntegrity(lines=0), _ours([]))
    steps = image_check_steps(markers, j.unproven)
    assert steps == [meg.step]
    script = image_check_script(markers, steps)
    ref = f"{REPO}@sha256:{'ab' * 32}"
    # The step really runs (bash, as in the image): the image's ENV wins over the planned default (Docker's rule).
    for env, expect in (({}, "import"), ({"INSTALL_MEGATRON": "0"}, "excluded")):
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "KANIKO_STANDIN_ROOT": "/nonexistent", **env})
        run = read_image_run(ref, "/u/check", out.stdout + out.stderr, markers, steps, j.unproven)
        if expect == "excluded":  # the image says INSTALL_MEGATRON=0: the standard branch
            assert run.contradicted and "megatron backend not installed (INSTALL_MEGATRON=0)" in run.contradicted[1]
            after = with_image_run(j, run)
            assert after.verdict == "contradicted" and after.contradicted == run.contradicted
        else:  # the import fails (no megatron in this root): not proven, and not an assertion (a CPU task)
            assert not run.contradicted and not run.proven and "exited 1" in run.failed[MEG], run
            after = with_image_run(j, run)
            assert after.verdict == "log_lost" and "exited 1" in after.unproven[MEG]
    good = "Megatron native imports OK\nFSDP torchtitan backend not installed (INSTALL_MEGATRON=1)\n" \
           "::gpu-rl-builder image check 0 exit=0\n"
    run = read_image_run(ref, "/u/check", good, markers, steps, j.unproven)
    assert list(run.proven) == [MEG] and "the image ran its own check" in run.proven[MEG]
    after = with_image_run(j, run)
    assert MEG in after.stood_in and MEG not in after.missing and after.verdict == "log_lost"  # values stay unproven
    silent = read_image_run(ref, "/u/check", "", markers, steps, j.unproven)
    assert "printed no end line" in silent.failed[MEG] and with_image_run(j, silent).verdict == "log_lost"
