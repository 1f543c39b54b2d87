"""Every image a build pulls is looked up in its registry before submission (#35 item 1, the registry part).

One-line edits of the real era-B and era-C trees, each of which the rehearsal passes (asserted: the old code
planned them) while kaniko or crane would fail at its pull on the cluster: a base tag or digest that does
not exist, a base with no manifest for the target's platform, a crane read of a missing image, a private base
the job has no credentials for. Each is refused naming the Dockerfile's FROM line (or the script's crane
line), the reference, the platform and the registry's answer. A registry that does not answer leaves the
reference "unchecked" (never passed, never refused as missing). The registries are real (Debian
docker-registry): the open one is the docker.io and gcr.io mirror holding the multi-platform stand-in bases
(sandbox/base_images.py); the token one is a ghcr-like private registry with a fault-injecting proxy.
"""

from __future__ import annotations

import asyncio

import pytest

from rehearsal.images import LookupSettings, check_target_images
from sandbox.base_images import push_base_images, push_image
from tests.contract.real import line_in
from tests.rehearsal.helpers import need_isolation, planned, rehearse

DF = "docker/Dockerfile.gpu-rl"
DF_ARM = "docker/Dockerfile.gpu-rl-arm64"
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
CUDA = "nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.04"
BASE_ARG = f"ARG BASE_IMAGE={CUDA}"
KANIKO_EXPORT = "crane export --platform \"$KANIKO_PLATFORM\" gcr.io/kaniko-project/executor:latest"


@pytest.fixture(scope="module")
def mirror(open_registry):
    """The open registry as docker.io's and gcr.io's mirror, holding the stand-in bases."""
    return {**push_base_images(open_registry.host)}, open_registry


def _settings(mirror, **kw) -> LookupSettings:
    mirrors, registry = mirror
    kw.setdefault("mirrors", mirrors)
    insecure = (registry.host, *kw.pop("insecure", ()))
    return LookupSettings(insecure_hosts=insecure, sleep=_no_sleep, **kw)


async def _no_sleep(_s: float) -> None:
    return None


def _edit(old: str, new: str):
    def apply(text: str) -> str:
        assert text.count(old) >= 1, old
        return text.replace(old, new)
    return apply


def _checked(tmp_path, era: str, edits, arches, settings: LookupSettings, *, mode: str = "required",
             accept: bool = False):
    """(refusal of the registry look-up, targets): the rehearsal itself must pass (the old code planned)."""
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, era, edits, arches=list(arches) if arches else None)
    rehearsed = rehearse(contract, targets, bundle, script, harbor, accept_unrehearsed=True)
    assert rehearsed is None, rehearsed
    refusal = asyncio.run(check_target_images(contract, targets, settings, harbor_commit=harbor, mode=mode,
                                              accept_unrehearsed=accept))
    return refusal, targets


def _from_lines(era: str, path: str = DF) -> set[str]:
    text = (line_in.__globals__["real_tree"](era) / path).read_text().splitlines()
    return {f"{path}:{i}" for i, t in enumerate(text, 1) if t.startswith("FROM ${BASE_IMAGE}")}


@pytest.mark.parametrize("era", ["era-b", "era-c"])
def test_the_unmodified_real_trees_plan_with_every_pull_found(tmp_path, mirror, era):
    """Control: every architecture each tree builds (era B's arm64 is blocked by its own script); the base (FROM ${BASE_IMAGE}) and, in era C, the crane read of
    the kaniko executor are looked up (through the mirror) and found for each target's platform."""
    refusal, targets = _checked(tmp_path, era, None, None, _settings(mirror))
    assert refusal is None, refusal
    for t in targets:
        checks = t.rehearsal.image_checks
        assert checks and all(c.status == "found" for c in checks), [c.describe() for c in checks]
        bases = [c for c in checks if c.read.what == "FROM"]
        assert bases and all(c.read.reference == CUDA and c.read.platform == t.kaniko_platform for c in bases)
        assert all("policy.rehearsal_registry_mirrors" in c.asked for c in checks)
        crane = [c for c in checks if c.read.what == "crane export"]
        assert [c.read.reference for c in crane] == ["gcr.io/kaniko-project/executor:latest"]
        assert "found in their registries" in t.rehearsal.describe()


def test_a_base_tag_that_does_not_exist_is_refused_naming_the_from_line(tmp_path, mirror):
    missing = "nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.40"
    refusal, (t, *_) = _checked(tmp_path, "era-c", {DF: _edit(BASE_ARG, f"ARG BASE_IMAGE={missing}")}, ["amd64"],
                             _settings(mirror))
    assert refusal and "not in its registry" in refusal, refusal
    (bad,) = {c.read.source.partition(" ")[0] for c in t.rehearsal.image_checks if c.status == "missing"} & \
        _from_lines("era-c")
    assert f"{bad}" in refusal and f"FROM {missing} for linux/amd64: no such tag or digest" in refusal, refusal
    assert "MANIFEST_UNKNOWN" in refusal and "the mirror of docker.io" in refusal


def test_a_base_digest_that_does_not_exist_is_refused(tmp_path, mirror):
    pinned = "nvidia/cuda@sha256:" + "0" * 64
    refusal, (t, *_) = _checked(tmp_path, "era-b", {DF: _edit(BASE_ARG, f"ARG BASE_IMAGE={pinned}")}, ["amd64"],
                             _settings(mirror))
    assert refusal and f"FROM {pinned} for linux/amd64: no such tag or digest" in refusal, refusal
    assert any(line in refusal for line in _from_lines("era-b")), refusal


def test_a_base_digest_that_exists_plans(tmp_path, mirror):
    """Control: the stand-in's own index digest, pinned (the registry's bytes hash to it)."""
    _, registry = mirror
    digest = push_image(registry.host, "nvidia/cuda", "pinned-control")
    refusal, (t, *_) = _checked(tmp_path, "era-b", {DF: _edit(BASE_ARG, f"ARG BASE_IMAGE=nvidia/cuda@{digest}")},
                             ["amd64"], _settings(mirror))
    assert refusal is None, refusal
    assert all(c.status == "found" for c in t.rehearsal.image_checks)


@pytest.mark.parametrize("as_index", [True, False], ids=["index", "single-manifest"])
def test_a_base_only_for_amd64_is_refused_for_arm64_and_planned_for_amd64(tmp_path, mirror, as_index):
    _, registry = mirror
    tag = f"amd64-only-{'index' if as_index else 'manifest'}"
    push_image(registry.host, "nvidia/cuda", tag, ("linux/amd64",), index=as_index)
    only = f"nvidia/cuda:{tag}"
    edits = {p: _edit(BASE_ARG, f"ARG BASE_IMAGE={only}") for p in (DF, DF_ARM)}
    refusal, (arm, *_) = _checked(tmp_path / "arm", "era-c", edits, ["arm64"], _settings(mirror))
    assert refusal and f"FROM {only} for linux/arm64:" in refusal, refusal
    assert ("has no manifest for linux/arm64: it offers linux/amd64" if as_index
            else "it is a single linux/amd64 image") in refusal, refusal
    assert any(line in refusal for line in _from_lines("era-c", arm.dockerfile)), refusal
    refusal, (amd, *_) = _checked(tmp_path / "amd", "era-c", edits, ["amd64"], _settings(mirror))
    assert refusal is None, refusal
    assert [c.status for c in amd.rehearsal.image_checks if c.read.what == "FROM"] == ["found"]


def test_a_from_platform_flag_is_the_platform_looked_up(tmp_path, mirror):
    """`FROM --platform=linux/amd64 ${BASE_IMAGE}` in the arm64 Dockerfile pulls the amd64 image: an amd64-only
    base is then found (and the platform looked up is the flag's, not the target's)."""
    _, registry = mirror
    push_image(registry.host, "nvidia/cuda", "amd64-only-flag", ("linux/amd64",))
    old = "FROM ${BASE_IMAGE} AS rl"
    edits = {DF_ARM: lambda text: _edit(BASE_ARG, "ARG BASE_IMAGE=nvidia/cuda:amd64-only-flag")(
        text).replace(old, "FROM --platform=linux/amd64 ${BASE_IMAGE} AS rl")}
    refusal, (t, *_) = _checked(tmp_path, "era-c", edits, ["arm64"], _settings(mirror))
    rl = [c for c in t.rehearsal.image_checks if c.read.source.startswith(f"{DF_ARM}:{line_in('era-c', DF_ARM, old)}")]
    assert rl and rl[0].read.platform == "linux/amd64" and rl[0].status == "found", [c.describe() for c in rl]
    # the other FROM ${BASE_IMAGE} (wheel-builder) has no flag: linux/arm64, which the image lacks
    assert refusal and "for linux/arm64" in refusal and "for linux/amd64" not in refusal, refusal


def test_a_crane_read_of_a_missing_image_is_refused_naming_the_script_line(tmp_path, mirror):
    edited = KANIKO_EXPORT.replace(":latest", ":v0.0.0-no-such-tag")
    refusal, (t, *_) = _checked(tmp_path, "era-c", {SCRIPT: _edit(KANIKO_EXPORT, edited)}, ["amd64"], _settings(mirror))
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, KANIKO_EXPORT)}"
    assert refusal and (f"{at}: crane export gcr.io/kaniko-project/executor:v0.0.0-no-such-tag for linux/amd64: "
                        "no such tag or digest") in refusal, refusal
    assert "the mirror of gcr.io" in refusal


@pytest.fixture(scope="module")
def private_base(token_registry):
    """A base in the job's own (ghcr-like) registry that is not public: anonymous callers get 401."""
    from tests.registry.imagepush import ImageSpec, Pusher

    async def push() -> None:
        pusher = Pusher(token_registry.url, token_registry.credentials)
        try:
            await pusher.push_index("team/private-cuda", "base", [ImageSpec("linux/amd64", seed="p1"),
                                                                 ImageSpec("linux/arm64", seed="p2")])
        finally:
            await pusher.aclose()
    asyncio.run(push())
    token_registry.set_public("team/private-cuda", False)
    return f"{token_registry.host}/team/private-cuda:base"


def test_a_private_base_is_found_with_the_jobs_credentials_and_refused_without(tmp_path, mirror, token_registry,
                                                                              private_base):
    edits = {DF: _edit(BASE_ARG, f"ARG BASE_IMAGE={private_base}")}
    calls: list[str] = []

    async def credentials() -> tuple[str, str]:
        calls.append("read")
        return token_registry.credentials

    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edits, arches=["amd64"])
    assert rehearse(contract, targets, bundle, script, harbor) is None
    own = _settings(mirror, insecure=(token_registry.host,), job_host=token_registry.host)
    refusal = asyncio.run(check_target_images(contract, targets, own, harbor_commit=harbor, mode="required",
                                              accept_unrehearsed=False, credentials=credentials))
    assert refusal is None, refusal
    (c, *_) = [c for c in targets[0].rehearsal.image_checks if c.read.what == "FROM"]
    assert c.status == "found" and "with the job's credentials (registry.user/registry.token)" in c.asked
    assert calls == ["read"]
    # The job's registry is another host: its credentials never go to this one, and the base is refused.
    other = _settings(mirror, insecure=(token_registry.host,), job_host="ghcr.io")
    refusal = asyncio.run(check_target_images(contract, targets, other, harbor_commit=harbor, mode="required",
                                              accept_unrehearsed=False, credentials=credentials))
    assert refusal and f"FROM {private_base} for linux/amd64: refused anonymously" in refusal, refusal
    assert calls == ["read"]  # not asked for: no reference was on the job's host
    assert token_registry.credentials[1] not in refusal


def test_an_unreachable_registry_leaves_the_base_unchecked_never_passed_nor_refused_as_missing(tmp_path, mirror):
    """docker.io's mirror is a closed port: every retry fails. Under `required` the plan is refused as unchecked
    (with the next step), not as a missing image; --accept-unrehearsed plans and the report records it;
    `best_effort` plans with it named."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mirrors, registry = mirror
    down = _settings(mirror, mirrors={**mirrors, "docker.io": f"127.0.0.1:{port}"}, insecure=(f"127.0.0.1:{port}",))
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", None, arches=["amd64"])
    assert rehearse(contract, targets, bundle, script, harbor) is None

    def check(mode: str, accept: bool) -> str | None:
        return asyncio.run(check_target_images(contract, targets, down, harbor_commit=harbor, mode=mode,
                                               accept_unrehearsed=accept))
    refusal = check("required", False)
    assert refusal and "could not be checked in its registry" in refusal and "--accept-unrehearsed" in refusal
    assert f"FROM {CUDA} for linux/amd64: unchecked, the registry did not answer (RegistryUnavailable" in refusal
    assert "not in its registry" not in refusal, refusal
    t = targets[0]
    assert {c.status for c in t.rehearsal.image_checks if c.read.what == "FROM"} == {"unchecked"}
    assert {c.status for c in t.rehearsal.image_checks if c.read.what == "crane export"} == {"found"}
    assert check("required", True) is None
    assert t.rehearsal.unrehearsed_accepted and "UNCHECKED" in t.rehearsal.describe()
    assert "accepted by the operator with --accept-unrehearsed" in t.rehearsal.describe()
    assert check("best_effort", False) is None and "UNCHECKED" in t.rehearsal.describe()


def test_a_transient_registry_error_is_retried_with_backoff(tmp_path, mirror, token_registry, private_base):
    """503s from the registry (the fault proxy): a few are retried and the base is found; more than the bounded
    retries leave it unchecked, never passed."""
    need_isolation()
    edits = {DF: _edit(BASE_ARG, f"ARG BASE_IMAGE={private_base}")}
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edits, arches=["amd64"])
    assert rehearse(contract, targets, bundle, script, harbor) is None
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
    settings = _settings(mirror, insecure=(token_registry.host,), job_host=token_registry.host,
                         job_credentials=token_registry.credentials, max_retries=3)
    settings.sleep = sleep
    token_registry.inject(503, 2)
    try:
        assert asyncio.run(check_target_images(contract, targets[:1], settings, harbor_commit=harbor,
                                               mode="required", accept_unrehearsed=False)) is None
    finally:
        token_registry.inject(503, 0)  # the registry is the session's: leave no fault queued
    assert len(slept) >= 2 and slept[1] > slept[0], slept
    token_registry.inject(503, 100)
    try:
        refusal = asyncio.run(check_target_images(contract, targets[:1], settings, harbor_commit=harbor,
                                                  mode="required", accept_unrehearsed=False))
    finally:
        token_registry.inject(503, 0)
    assert refusal and "could not be checked" in refusal and "HTTP 503" in refusal, refusal


def test_a_crane_probe_of_a_missing_image_leaves_what_followed_unproven(tmp_path, mirror):
    """`crane digest X || …` asks whether X exists; the rehearsal's stand-in answered yes. The registry says no:
    the path the script took in the rehearsal is not the one it takes on the cluster, so the plan is refused as
    unproven under `required` (not as a missing pull), and --accept-unrehearsed plans with it recorded."""
    probe = 'crane digest gcr.io/kaniko-project/executor:v0-no-such || echo "no such executor"'
    edits = {SCRIPT: _edit(KANIKO_EXPORT, probe + "\n" + KANIKO_EXPORT)}
    refusal, (t, *_) = _checked(tmp_path, "era-c", edits, ["amd64"], _settings(mirror))
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, KANIKO_EXPORT)}"  # the inserted line takes the export's number
    assert refusal and f"{at}: crane digest gcr.io/kaniko-project/executor:v0-no-such: no such tag" in refusal, refusal
    assert "the rehearsal's crane stand-in answered that it exists" in refusal and "--accept-unrehearsed" in refusal
    assert "not in its registry" not in refusal


def test_where_the_rehearsal_could_not_run_the_planned_bases_are_looked_up(tmp_path, mirror):
    """`best_effort` on a worker that cannot rehearse: no records, so the planned final build's bases (the
    Dockerfile with the plan's build args) are looked up instead; a missing one still refuses, naming the FROM
    line; the unedited tree plans."""
    from rehearsal.result import RehearsalResult

    missing = "nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.40"
    for edits, ok in ((None, True), ({DF: _edit(BASE_ARG, f"ARG BASE_IMAGE={missing}")}, False)):
        contract, targets, _, _, harbor = planned(tmp_path / str(ok), "era-c", edits, arches=["amd64"])
        for t in targets:
            t.rehearsal = RehearsalResult(status="skipped", reason="no isolation")
        refusal = asyncio.run(check_target_images(contract, targets, _settings(mirror), harbor_commit=harbor,
                                                  mode="best_effort", accept_unrehearsed=False))
        t = targets[0]
        bases = [c for c in t.rehearsal.image_checks if c.read.what == "FROM"]
        assert bases and {c.read.source for c in bases} <= _from_lines("era-c"), [c.describe() for c in bases]
        if ok:
            assert refusal is None and all(c.status == "found" for c in bases), refusal
        else:
            assert refusal and f"FROM {missing} for linux/amd64: no such tag or digest" in refusal, refusal


def test_a_from_using_an_automatic_platform_arg_expands_and_is_looked_up(tmp_path, mirror):
    """`FROM nvidia/cuda:standin-${TARGETARCH}`: BuildKit and kaniko define TARGETARCH in the global scope, so
    the FROM expands (the old code refused it: "TARGETARCH has no value") and its expansion for the target's
    platform is what is looked up: found for amd64."""
    _, registry = mirror
    push_image(registry.host, "nvidia/cuda", "standin-amd64", ("linux/amd64",))
    old = "FROM ${BASE_IMAGE} AS rl"
    refusal, (t, *_) = _checked(tmp_path, "era-c", {DF: _edit(old, "FROM nvidia/cuda:standin-${TARGETARCH} AS rl")},
                                ["amd64"], _settings(mirror))
    assert refusal is None, refusal
    at = f"{DF}:{line_in('era-c', DF, old)}"
    (rl,) = [c for c in t.rehearsal.image_checks if c.read.source.startswith(at + " ")]
    assert rl.read.reference == "nvidia/cuda:standin-amd64" and rl.status == "found", rl.describe()
