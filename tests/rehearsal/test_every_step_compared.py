"""One-line edits of the real era-C tree that the rehearsal used to pass while the cluster would fail or bake
the wrong thing (#26): each is now refused naming file:line; the unedited tree passes
(test_rehearsal_real.py). Expected lines are found in the real files by their text (line_in)."""

from __future__ import annotations

import base64

import pytest

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.outcome import input_failure
from rehearsal.model import crane_images, find_placeholder, placeholder_forms
from tests.contract.real import line_in
from tests.rehearsal.helpers import need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
DF_AMD = "docker/Dockerfile.gpu-rl"
DF_ARM = "docker/Dockerfile.gpu-rl-arm64"
FINAL_GITSHA = '  --build-arg GITSHA="$GITSHA" \\\n  --build-arg HARBOR_COMMIT'  # the exec call (2-space indent)
WHEEL_GITSHA = '    --build-arg GITSHA="$GITSHA" \\\n    --build-arg HARBOR_COMMIT'  # the wheel-artifact call


def _edit(old: str, new: str):
    def apply(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)
    return apply


def _line(needle: str, path: str = SCRIPT) -> str:
    return f"{path}:{line_in('era-c', path, needle)}"


def _refused(tmp_path, edits, arches=("amd64",), **kw):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edits, arches=list(arches))
    refusal = rehearse(contract, targets, bundle, script, harbor, **kw)
    return refusal, targets, contract


def test_a_pinned_arg_overridden_in_the_final_kaniko_call_refuses_naming_the_pin_and_the_call(tmp_path):
    refusal, targets, _ = _refused(tmp_path, {SCRIPT: _edit(FINAL_GITSHA, FINAL_GITSHA.replace(
        '"$GITSHA" \\', '"$GITSHA" --build-arg TORCH_VERSION=2.10.0 \\'))}, arches=("amd64", "arm64"))
    assert refusal
    for t in targets:
        df = DF_AMD if t.architecture == "amd64" else DF_ARM
        (d,) = [d for d in t.rehearsal.differences if d.field == "--build-arg TORCH_VERSION"]
        assert (d.planned, d.script) == ("2.11.0", "2.10.0")
        assert d.planned_source.startswith(_line("ARG TORCH_VERSION=2.11.0", df))
        assert d.script_source == _line("exec /kaniko/executor")
        assert f"the plan has 2.11.0 ({d.planned_source}), the script asked kaniko for 2.10.0 at {d.script_source}" \
            in refusal
    request = BuildRequest(architectures=["amd64", "arm64"],
                           compatibility_request=CompatibilityRequest(requested_by="t", reason="r"))
    assert input_failure("InputError", refusal, request).next_step.startswith(
        "the script overrides a Dockerfile pin with --build-arg")


def test_a_pinned_arg_overridden_in_the_earlier_wheel_call_refuses_naming_that_call(tmp_path):
    """Only the final call was compared: the wheel-artifact build (hours of nvcc) baked flash-attn 2.7.4."""
    refusal, (t, *_), _ = _refused(tmp_path, {SCRIPT: _edit(WHEEL_GITSHA, WHEEL_GITSHA.replace(
        '"$GITSHA" \\', '"$GITSHA" --build-arg FLASH_ATTN_VERSION=2.7.4 \\'))})
    wheel_call = f"{SCRIPT}:{line_in('era-c', SCRIPT, '--target wheel-artifact') - 3}"  # `/kaniko/executor \`
    (d,) = t.rehearsal.differences
    assert (d.field, d.planned, d.script, d.script_source) == ("--build-arg FLASH_ATTN_VERSION", "2.8.3", "2.7.4",
                                                               wheel_call)
    assert d.planned_source.startswith(_line("ARG FLASH_ATTN_VERSION=2.8.3", DF_AMD))
    assert refusal and wheel_call in refusal and _line("ARG FLASH_ATTN_VERSION=2.8.3", DF_AMD) in refusal


def test_a_wheel_tag_typo_read_by_crane_refuses_naming_the_read_and_the_push(tmp_path):
    """The crane stand-in serves any image: the typo passed, and failed on the cluster after the compile."""
    refusal, targets, contract = _refused(tmp_path, {SCRIPT: _edit(
        'WHEEL_IMAGE="${IMAGE_REPOSITORY}:wheels-', 'WHEEL_IMAGE="${IMAGE_REPOSITORY}:wheel-')},
        arches=("amd64", "arm64"))
    read = _line('crane export --platform "$KANIKO_PLATFORM" "$WHEEL_IMAGE"')
    push = f"{SCRIPT}:{line_in('era-c', SCRIPT, '--target wheel-artifact') - 3}"
    for t in targets:
        suffix = "-arm64" if t.architecture == "arm64" else ""
        (d,) = t.rehearsal.differences
        assert d.field == "image read" and d.script_source == read
        assert d.script == f"{t.image_repository}:wheel-{contract.commit}{suffix}"
        assert d.planned == f"{t.image_repository}:wheels-{contract.commit}{suffix}"
        assert f"`crane export` at {read} reads {d.script}, which no earlier step" in refusal
        assert f"the nearest earlier push is {d.planned} (at {push})" in refusal


@pytest.mark.parametrize("how", ["docker config (base64 of user:token)", "raw", "base64 at offset 1", "hex",
                                 "URL-encoded"])
def test_a_credential_written_into_the_build_context_refuses_naming_the_file(tmp_path, how):
    """`COPY cloud` bakes whatever the script leaves under /app/cloud."""
    leak = {
        "raw": 'printf "%s" "$REGISTRY_TOKEN" > "$DOCKER_CONTEXT/cloud/leak"; ',
        "base64 at offset 1": 'printf "x%s" "$REGISTRY_TOKEN" | base64 > "$DOCKER_CONTEXT/cloud/leak"; ',
        "hex": 'printf "%s" "$REGISTRY_TOKEN" | od -An -v -tx1 | tr -d " \\n" > "$DOCKER_CONTEXT/cloud/leak"; ',
        # urllib.parse.quote(token + "/", safe=""), in the task image's own tools (it has no python3)
        "URL-encoded": 'printf "%s/" "$REGISTRY_TOKEN" | sed "s,/,%2F,g" > "$DOCKER_CONTEXT/cloud/leak"; ',
    }.get(how)
    if leak is None:  # one word: the auth file goes to the build context instead of /kaniko/.docker
        edit = _edit('"$REGISTRY_HOST" "$DOCKER_CONFIG"', '"$REGISTRY_HOST" "$DOCKER_CONTEXT/cloud"')
        where = "cloud/config.json"
    else:
        edit = _edit("unset REGISTRY_TOKEN\n", leak + "unset REGISTRY_TOKEN\n")
        where = "cloud/leak"
    refusal, (t, *_), _ = _refused(tmp_path, {SCRIPT: edit})
    assert t.rehearsal.status == "failed"
    assert refusal and "leaves a credential in the build context" in refusal
    assert f"/app/{where} holds rehearsal-placeholder-registry_token" in refusal


def test_a_copy_source_missing_from_the_bundle_refuses_naming_the_dockerfile_line(tmp_path):
    refusal, targets, _ = _refused(tmp_path, {DF_AMD: _edit("COPY cloud ${SKYRL_HOME}/cloud",
                                                            "COPY clouds ${SKYRL_HOME}/cloud")},
                                   arches=("amd64", "arm64"))
    at = _line("COPY cloud ${SKYRL_HOME}/cloud", DF_AMD)
    for t in targets:
        if t.architecture == "arm64":  # its own Dockerfile copies cloud: it passes
            assert t.rehearsal.status == "passed", t.rehearsal.describe()
            continue
        (d,) = t.rehearsal.differences
        assert d.field == "COPY source" and d.planned == at and d.script == "clouds"
    assert refusal and f"{at}: `COPY` of clouds: not in the build context" in refusal


def test_a_later_real_failure_is_not_hidden_by_an_earlier_stood_in_download(tmp_path):
    """A tolerated download that the stand-in cannot serve turned the later real failure into "skipped"."""
    refusal, (t, *_), _ = _refused(tmp_path, {
        SCRIPT: _edit("cd /tmp\n", "cd /tmp; curl -fsS https://example.invalid/notes.txt -o notes.txt || true\n"),
        "docker/write_registry_auth.sh": None})
    at = _line('REGISTRY_USER="$REGISTRY_USER" REGISTRY_TOKEN=')  # the statement running write_registry_auth.sh
    assert t.rehearsal.status == "failed" and t.rehearsal.line == at, t.rehearsal.describe()
    assert refusal and f"exits 127 at {at}" in refusal


def test_skipped_only_when_the_failing_statement_is_the_stood_in_download(tmp_path):
    need_isolation()
    contract, (t, *_), bundle, script, harbor = planned(tmp_path, "era-c", arches=["amd64"])
    for e in t.job.env:
        if e.name == "WHEEL_SOURCE":
            e.value = "prebuilt-wheelhouse"
    t.job.env += [e.model_copy(update={"name": n, "value": v, "secret": None}) for n, v in (
        ("PREBUILT_WHEEL_ARTIFACT_URI", "https://wheels.example.invalid/vllm-wheels.tar.gz"),
        ("PREBUILT_WHEEL_ARTIFACT_SHA256", "a" * 64))]
    at = _line('https://*) curl -fsSL "$PREBUILT_WHEEL_ARTIFACT_URI"')
    refusal = rehearse(contract, [t], bundle, script, harbor)  # required: the unrehearsed rest refuses (#35)
    assert refusal and f"unrehearsed from {at}" in refusal and "--accept-unrehearsed" in refusal, refusal
    assert rehearse(contract, [t], bundle, script, harbor, accept_unrehearsed=True) is None
    assert t.rehearsal.status == "skipped" and t.rehearsal.line == at and t.rehearsal.unrehearsed_accepted
    assert t.rehearsal.reason.startswith("the script needs curl download https://wheels.example.invalid/")


# ----------------------------------------------------------------------------- pure parts

@pytest.mark.parametrize("prefix", [b"", b"u", b"us", b"use"])
def test_placeholder_found_in_every_encoding_at_every_offset(prefix):
    p = "rehearsal-placeholder-registry_token"
    forms = placeholder_forms([p])
    from urllib.parse import quote
    for data in (prefix + p.encode(), base64.b64encode(prefix + b":" + p.encode()),
                 base64.urlsafe_b64encode(prefix + p.encode()).rstrip(b"="), (prefix + p.encode()).hex().encode(),
                 quote(prefix.decode() + p + "/", safe="").encode()):
        assert find_placeholder(b"{junk}" + data + b"\n", forms), data
    assert find_placeholder(b"rehearsal-placeholder-other", forms) is None


def test_crane_reads_and_writes():
    assert crane_images(["export", "--platform", "linux/amd64", "r/x:wheels-1", "-"]) == ("export", ["r/x:wheels-1"], [])
    assert crane_images(["pull", "r/a:1", "r/b:2", "out.tar"]) == ("pull", ["r/a:1", "r/b:2"], [])
    assert crane_images(["copy", "r/a:1", "r/b:2"]) == ("copy", ["r/a:1"], ["r/b:2"])
    assert crane_images(["tag", "r/a:1", "two"]) == ("tag", ["r/a:1"], ["r/a:two"])
    assert crane_images(["digest", "r/a:1"]) == ("digest", ["r/a:1"], [])
    assert crane_images(["--platform", "linux/arm64", "export", "r/a:1", "-"]) == ("export", ["r/a:1"], [])
    assert crane_images(["--insecure", "pull", "r/a:1", "o.tar"]) == ("pull", ["r/a:1"], [])


def test_no_push_pushes_nothing_for_a_later_read(tmp_path):
    """An earlier kaniko call with --no-push: the wheel image crane reads next was never pushed."""
    refusal, (t, *_), _ = _refused(tmp_path, {SCRIPT: _edit(WHEEL_GITSHA, WHEEL_GITSHA.replace(
        '"$GITSHA" \\', '"$GITSHA" --no-push \\'))})
    (d,) = t.rehearsal.differences
    assert d.field == "image read" and d.script_source == _line('crane export --platform "$KANIKO_PLATFORM" "$WHEEL_IMAGE"')
    assert "no earlier step pushed any image" in refusal


def test_era_b_pin_override_in_the_decoded_script_names_the_repo_line(tmp_path):
    """Era B runs a decoded copy (/tmp/...): the refusal still names the repository file:line."""
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-b", {SCRIPT: _edit(
        FINAL_GITSHA, FINAL_GITSHA.replace('"$GITSHA" \\', '"$GITSHA" --build-arg TORCH_VERSION=2.10.0 \\'))},
        arches=["amd64"])
    refusal = rehearse(contract, targets, bundle, script, harbor)
    call = f"{SCRIPT}:{line_in('era-b', SCRIPT, 'exec /kaniko/executor')} (run as /tmp/"
    pin = f"{DF_AMD}:{line_in('era-b', DF_AMD, 'ARG TORCH_VERSION=2.11.0')}"
    for t in targets:
        (d,) = t.rehearsal.differences
        assert d.field == "--build-arg TORCH_VERSION" and d.script_source.startswith(call), d
        assert d.planned_source.startswith(pin)
    assert refusal and pin in refusal and call in refusal
