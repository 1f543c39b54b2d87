"""kaniko and crane argv read with their real flag sets (#35 item 2): one-line edits of the real era-C script.

Short forms (`-d`, `-c`, `-f`), `--flag=value` and `--flag value` are read as kaniko's pflag reads them; an
unknown flag refuses as kaniko would; --context, crane's --platform and a build arg the call misses (with the
ARG default in force in the stage that uses it) are compared. Each refusal names the script line; the
controls (same call in other spellings) plan. Lines are found by their text in the real files."""

from __future__ import annotations

import pytest

from tests.contract.real import line_in
from tests.rehearsal.helpers import need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
DF_AMD = "docker/Dockerfile.gpu-rl"
FINAL_GITSHA = '  --build-arg GITSHA="$GITSHA" \\\n  --build-arg HARBOR_COMMIT'
FINAL_CONTEXT = '  --context "dir://${DOCKER_CONTEXT}" \\\n  --dockerfile "$DOCKERFILE" \\\n  --build-arg WHEEL'
KANIKO_EXPORT = 'crane export --platform "$KANIKO_PLATFORM" gcr.io/kaniko-project/executor:latest'


def _edit(old: str, new: str):
    def apply(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)
    return apply


def _run(tmp_path, edit, arches=("amd64",)):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", {SCRIPT: edit}, arches=list(arches))
    return rehearse(contract, targets, bundle, script, harbor), targets


EXEC = f"{SCRIPT}:{line_in('era-c', SCRIPT, 'exec /kaniko/executor')}"


def test_a_short_destination_flag_is_a_foreign_destination(tmp_path):
    """`-d` was skipped: a silent second push to someone else's repository passed."""
    refusal, (t, *_) = _run(tmp_path, _edit(FINAL_GITSHA, FINAL_GITSHA.replace(
        '"$GITSHA" \\', '"$GITSHA" -d ghcr.io/someone-else/marinskyrl:latest \\')))
    (d,) = [d for d in t.rehearsal.differences if d.field == "destinations"]
    assert "ghcr.io/someone-else/marinskyrl:latest" in d.script and d.script_source == EXEC
    assert refusal and "ghcr.io/someone-else/marinskyrl:latest" in refusal


def test_an_unknown_kaniko_flag_refuses_as_kaniko_would(tmp_path):
    refusal, (t, *_) = _run(tmp_path, _edit(FINAL_GITSHA, FINAL_GITSHA.replace('"$GITSHA" \\', '"$GITSHA" --squash \\')))
    assert t.rehearsal.status == "failed"
    assert refusal and f"kaniko exits at once on its command line (unknown flag: --squash) at {EXEC}" in refusal


def test_a_context_other_than_the_bundle_refuses(tmp_path):
    refusal, (t, *_) = _run(tmp_path, _edit(FINAL_CONTEXT, FINAL_CONTEXT.replace(
        '"dir://${DOCKER_CONTEXT}"', '"dir://${DOCKER_CONTEXT}/docker"')))
    (d,) = [d for d in t.rehearsal.differences if d.field == "context"]
    assert d.script == "dir:///app/docker" and d.script_source == EXEC
    assert refusal and "context: the plan has dir:///app" in refusal


def test_the_same_call_in_short_and_equals_forms_plans(tmp_path):
    """The control: `-c X -f Y` and `--build-arg=K=V` are the same call to kaniko."""
    def edit(text: str) -> str:
        text = _edit(FINAL_CONTEXT, FINAL_CONTEXT.replace('--context "dir', '-c "dir').replace(
            '--dockerfile "$DOCKERFILE"', '-f"$DOCKERFILE"'))(text)
        return _edit(FINAL_GITSHA, FINAL_GITSHA.replace('--build-arg GITSHA=', '--build-arg=GITSHA='))(text)
    refusal, targets = _run(tmp_path, edit)
    assert refusal is None, refusal
    assert all(t.rehearsal.status == "passed" for t in targets)


def test_crane_export_of_kaniko_without_platform_refuses_on_arm64(tmp_path):
    """crane picks linux/amd64 out of the kaniko index when --platform is missing: amd64 binaries on arm64."""
    refusal, targets = _run(tmp_path, _edit(KANIKO_EXPORT, "crane export gcr.io/kaniko-project/executor:latest"),
                            arches=("amd64", "arm64"))
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, KANIKO_EXPORT)}"
    by = {t.architecture: t.rehearsal for t in targets}
    assert by["amd64"].status == "passed", by["amd64"].describe()
    (d,) = [d for d in by["arm64"].differences if d.field == "crane platform"]
    assert d.script_source == at and d.planned == "linux/arm64" and "crane's default" in d.script
    assert refusal and f"`crane export` at {at} reads gcr.io/kaniko-project/executor:latest for linux/amd64" in refusal


def test_a_build_arg_name_typo_is_caught_by_the_stage_default(tmp_path):
    """GITSHA is declared in stage rl (`ARG GITSHA=unknown`), not globally: the typo baked "unknown"."""
    refusal, (t, *_) = _run(tmp_path, _edit(FINAL_GITSHA, FINAL_GITSHA.replace("GITSHA=", "GITSAH=")))
    (d,) = [d for d in t.rehearsal.differences if d.field == "--build-arg GITSHA"]
    stage = f"{DF_AMD}:{line_in('era-c', DF_AMD, 'FROM ${BASE_IMAGE} AS rl')}"
    assert f"in stage rl, {stage}, ARG GITSHA is unknown" in d.script and "GITSAH" in d.script
    assert d.script_source == EXEC and refusal and stage in refusal


@pytest.mark.parametrize(("argv", "error"), [
    (["--squash"], "unknown flag: --squash"),
    (["-x"], "unknown shorthand flag: 'x' in -x"),
    (["--destination"], "flag needs an argument: --destination"),
    (["--cache", "false"], None),  # a boolean takes no separate value: `false` is a positional word
    (["--cache=maybe"], 'invalid argument "maybe" for "--cache" flag: strconv.ParseBool: parsing \'maybe\''),
])
def test_kaniko_flag_errors(argv, error):
    from rehearsal.model import kaniko_flags

    assert kaniko_flags(argv)[1] == error


def test_kaniko_flag_forms():
    from rehearsal.model import parse_kaniko_argv

    k = parse_kaniko_argv(["-d", "r/a:1", "-dr/b:2", "-d=r/c:3", "--destination=r/d:4", "--destination", "r/e:5",
                           "-c", "dir:///app", "-f=docker/Dockerfile", "--cache=false", "--no-push",
                           "--context-sub-path", "sub", "--custom-platform=linux/arm64"])
    assert k.destinations == ["r/a:1", "r/b:2", "r/c:3", "r/d:4", "r/e:5"]
    assert (k.context, k.dockerfile, k.cache, k.no_push, k.context_sub_path, k.platform, k.error) == (
        "dir:///app", "docker/Dockerfile", False, True, "sub", "linux/arm64", None)
