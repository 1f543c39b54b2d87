"""validate_image end to end against the real local registry in open, htpasswd and token modes."""

from __future__ import annotations

import httpx

from clients.image_validator import probe_anonymous_pull, validate_image
from domain.validation import ExpectedImage
from tests.registry.imagepush import GOOD_SOURCE, ImageSpec, Pusher, good_labels

REV, HARBOR = "a" * 40, "b" * 40


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def expected(platform="linux/amd64", **kw) -> ExpectedImage:
    base = dict(platform=platform, source_url=GOOD_SOURCE, revision=REV, harbor_commit=HARBOR, min_layers=3,
                max_layer_bytes=1_000_000, warn_layer_bytes=500_000)
    return ExpectedImage(**{**base, **kw})


async def push_index(handle, repo, tag, specs, **kw):
    pusher = Pusher(handle.url, handle.credentials)
    try:
        return await pusher.push_index(repo, tag, specs, **kw)
    finally:
        await pusher.aclose()


async def push_image(handle, repo, tag, spec):
    pusher = Pusher(handle.url, handle.credentials)
    try:
        return await pusher.push_image(repo, tag, spec)
    finally:
        await pusher.aclose()


async def validate(handle, repo, tag, exp, **kw):
    kw.setdefault("sleep", RecordingSleep())
    return await validate_image(image_repository=f"{handle.host}/{repo}", tag=tag, expected=exp,
                                credentials=handle.credentials, insecure_hosts=[handle.host], **kw)


def by_name(report):
    return {c.name: c for c in report.checks}


async def test_oci_index_with_attestations_validates_arm64(open_registry):
    digest, images = await push_index(open_registry, "lab/multi", "v1-arm64", [
        ImageSpec("linux/amd64", labels=good_labels(REV, HARBOR), seed="m1"),
        ImageSpec("linux/arm64", labels=good_labels(REV, HARBOR), seed="m2", layers=4)])
    report = await validate(open_registry, "lab/multi", "v1-arm64", expected("linux/arm64"))
    assert report.ok, report.failures()
    assert report.digest == digest and report.platform_digest == images[1].digest
    assert report.platform == "linux/arm64" and report.layer_count == 4
    assert report.largest_layer_bytes == max(images[1].layer_sizes)
    assert report.total_bytes == sum(images[1].layer_sizes)
    assert report.anonymous_pull == "pullable"
    assert report.labels["org.marin.harbor-commit"] == HARBOR
    assert "attestation" in by_name(report)["platform"].detail
    assert report.pinned_ref == f"{open_registry.host}/lab/multi@{digest}"


async def test_docker_schema2_single_manifest_public_token_registry(token_registry):
    token_registry.set_public("lab/kaniko-pub", True)
    img = await push_image(token_registry, "lab/kaniko-pub", "sha-amd64",
                           ImageSpec(docker=True, labels=good_labels(REV, HARBOR), seed="k"))
    report = await validate(token_registry, "lab/kaniko-pub", "sha-amd64", expected())
    assert report.ok, report.failures()
    assert report.digest == img.digest and report.platform == "linux/amd64"
    assert report.media_type == "application/vnd.docker.distribution.manifest.v2+json"


async def test_wrong_platform_in_index_and_in_config(open_registry):
    await push_index(open_registry, "lab/wrong", "only-amd64",
                     [ImageSpec("linux/amd64", labels=good_labels(REV, HARBOR), seed="w1")])
    report = await validate(open_registry, "lab/wrong", "only-amd64", expected("linux/arm64"))
    assert not report.ok and by_name(report)["platform"].verdict == "fail"
    await push_image(open_registry, "lab/wrong", "arm-config",
                     ImageSpec("linux/arm64", labels=good_labels(REV, HARBOR), seed="w2"))
    report = await validate(open_registry, "lab/wrong", "arm-config", expected("linux/amd64"))
    assert by_name(report)["config_platform"].verdict == "fail"
    assert report.platform == "linux/arm64"


async def test_index_entry_lying_about_config_platform_fails(open_registry):
    await push_index(open_registry, "lab/liar", "v1", [
        ImageSpec("linux/amd64", labels=good_labels(REV, HARBOR), seed="l1", config_arch="arm64")])
    report = await validate(open_registry, "lab/liar", "v1", expected("linux/amd64"))
    assert by_name(report)["index_entry_platform"].verdict == "fail"
    assert not report.ok


async def test_aarch64_config_normalised(open_registry):
    await push_image(open_registry, "lab/uname", "v1",
                     ImageSpec("linux/arm64", labels=good_labels(REV, HARBOR), seed="u", config_arch="aarch64"))
    report = await validate(open_registry, "lab/uname", "v1", expected("linux/arm64"))
    assert report.ok, report.failures()


async def test_layer_ceilings_count_and_diff_ids(open_registry):
    img = await push_image(open_registry, "lab/shape", "v1",
                           ImageSpec(labels=good_labels(REV, HARBOR), seed="s", layers=3, layer_bytes=4096))
    largest = max(img.layer_sizes)
    too_big = await validate(open_registry, "lab/shape", "v1", expected(max_layer_bytes=largest))
    assert by_name(too_big)["largest_layer"].verdict == "fail" and not too_big.ok
    warned = await validate(open_registry, "lab/shape", "v1",
                            expected(max_layer_bytes=largest + 1, warn_layer_bytes=largest - 1))
    assert by_name(warned)["largest_layer"].verdict == "warn" and warned.ok
    few = await validate(open_registry, "lab/shape", "v1", expected(min_layers=20))
    assert by_name(few)["layer_count"].verdict == "fail"
    await push_image(open_registry, "lab/shape", "bad-rootfs",
                     ImageSpec(labels=good_labels(REV, HARBOR), seed="s2", drop_diff_ids=1))
    broken = await validate(open_registry, "lab/shape", "bad-rootfs", expected())
    assert by_name(broken)["diff_ids"].verdict == "fail"


async def test_missing_and_mismatched_labels(open_registry):
    await push_image(open_registry, "lab/labels", "none", ImageSpec(labels=None, seed="n"))
    none = await validate(open_registry, "lab/labels", "none", expected())
    label_checks = [c for c in none.checks if c.name.startswith("label:")]
    assert len(label_checks) == 3 and all(c.verdict == "fail" and c.observed == "missing" for c in label_checks)
    await push_image(open_registry, "lab/labels", "stale", ImageSpec(labels=good_labels("c" * 40, HARBOR), seed="m"))
    stale = await validate(open_registry, "lab/labels", "stale", expected())
    rev = by_name(stale)["label:org.opencontainers.image.revision"]
    assert rev.verdict == "fail" and rev.observed == "c" * 40 and rev.expected == REV
    assert by_name(stale)["label:org.marin.harbor-commit"].verdict == "pass"


async def test_private_repo_blocks_on_visibility_until_made_public(token_registry):
    await push_image(token_registry, "lab/internal", "v1-amd64", ImageSpec(labels=good_labels(REV, HARBOR), seed="i"))
    sleep = RecordingSleep()
    blocked = await validate(token_registry, "lab/internal", "v1-amd64", expected(), sleep=sleep)
    assert blocked.anonymous_pull == "not_anonymously_pullable"
    assert blocked.blocked_on_visibility and not blocked.ok
    assert "token" in by_name(blocked)["anonymous_pull"].detail
    assert sleep.calls == []  # a definite answer is not retried
    token_registry.set_public("lab/internal", True)
    try:
        public = await validate(token_registry, "lab/internal", "v1-amd64", expected())
    finally:
        token_registry.set_public("lab/internal", False)
    assert public.ok and public.anonymous_pull == "pullable" and public.digest == blocked.digest


async def test_basic_auth_registry_is_not_anonymously_pullable(htpasswd_registry):
    await push_image(htpasswd_registry, "lab/basic-v", "v1", ImageSpec(labels=good_labels(REV, HARBOR), seed="bv"))
    report = await validate(htpasswd_registry, "lab/basic-v", "v1", expected())
    assert report.anonymous_pull == "not_anonymously_pullable"
    assert "Basic" in by_name(report)["anonymous_pull"].detail
    assert report.blocked_on_visibility


async def test_missing_tag_fails_digest_check(open_registry):
    report = await validate(open_registry, "lab/multi", "no-such-tag", expected())
    assert by_name(report)["digest"].verdict == "fail" and report.digest is None and not report.ok


async def test_injected_429_is_retried_with_retry_after(token_registry):
    token_registry.set_public("lab/busy", True)
    await push_image(token_registry, "lab/busy", "v1", ImageSpec(labels=good_labels(REV, HARBOR), seed="bz"))
    sleep = RecordingSleep()
    token_registry.inject(429, 2, retry_after=2)
    report = await validate(token_registry, "lab/busy", "v1", expected(), sleep=sleep)
    assert report.ok, report.failures()
    assert sleep.calls == [2.0, 2.0]


async def test_injected_503_makes_anonymous_probe_inconclusive_never_private(token_registry):
    token_registry.set_public("lab/flaky", True)
    img = await push_image(token_registry, "lab/flaky", "v1", ImageSpec(labels=good_labels(REV, HARBOR), seed="f"))
    token_registry.inject(503, 100)
    try:
        probe = await probe_anonymous_pull(token_registry.host, "lab/flaky", img.digest, scheme="http",
                                           sleep=RecordingSleep())
        report = await validate(token_registry, "lab/flaky", "v1", expected(), anonymous_attempts=2)
    finally:
        token_registry.inject(503, 0)
    assert probe.verdict == "inconclusive"
    assert by_name(report)["digest"].verdict == "inconclusive" and not report.ok
    assert report.anonymous_pull is None


class FaultsOnceAnonymous(httpx.AsyncHTTPTransport):
    """Real transport; when the anonymous probe asks for a token, the registry starts answering 503."""

    def __init__(self, handle) -> None:
        super().__init__()
        self.handle = handle

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token" and "authorization" not in request.headers:
            self.handle.inject(503, 1000)
        return await super().handle_async_request(request)


async def test_anonymous_inconclusive_is_retried_then_reported(token_registry):
    token_registry.set_public("lab/flaky2", True)
    await push_image(token_registry, "lab/flaky2", "v1", ImageSpec(labels=good_labels(REV, HARBOR), seed="f2"))
    sleep = RecordingSleep()
    try:
        report = await validate(token_registry, "lab/flaky2", "v1", expected(), sleep=sleep, max_retries=1,
                                anonymous_attempts=3, anonymous_retry_delay_s=7,
                                transport=FaultsOnceAnonymous(token_registry))
    finally:
        token_registry.inject(503, 0)
    assert report.anonymous_pull == "inconclusive"
    assert by_name(report)["anonymous_pull"].verdict == "inconclusive"
    assert not report.ok and not report.blocked_on_visibility
    assert all(c.verdict == "pass" for c in report.checks if c.name != "anonymous_pull")
    assert sleep.calls.count(7) == 2  # three attempts, two waits between them


def test_a_log_claiming_another_pushed_digest_fails_validation_naming_both():
    """issue #21 item 7: the digest in the build log must be the registry's."""
    from domain.validation import CheckResult, ValidationReport, check_claimed_digest

    served, claimed = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    report = ValidationReport(image_ref="r.example/x", tag="t", digest=served, platform="linux/amd64",
                              layer_count=20, largest_layer_bytes=1, total_bytes=1, anonymous_pull="pullable",
                              labels={}, checks=[CheckResult(name="platform", expected="a", observed="a",
                                                             verdict="pass")])
    assert report.ok and check_claimed_digest(report, served).ok and check_claimed_digest(report, None).ok
    bad = check_claimed_digest(report, claimed)
    assert not bad.ok
    (check,) = bad.failures()
    assert check.name == "pushed_digest" and claimed in check.detail and served in check.detail
    assert check_claimed_digest(report.model_copy(update={"platform_digest": claimed}), claimed).ok
