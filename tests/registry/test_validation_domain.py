"""Pure check functions and report properties (no registry)."""

from __future__ import annotations

import json

import pytest

from domain.validation import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    CheckResult,
    ManifestError,
    Platform,
    ValidationReport,
    check_config_platform,
    check_diff_ids,
    check_label,
    check_largest_layer,
    check_layer_count,
    parse_manifest,
    select_platform,
)


def test_platform_normalisation():
    assert Platform.parse("linux/aarch64") == Platform(os="linux", architecture="arm64", variant="v8")
    assert str(Platform.normalized("linux", "x86_64")) == "linux/amd64"
    assert str(Platform.normalized("linux", "arm64", "v8")) == "linux/arm64"
    assert str(Platform.normalized("linux", "arm", "v7")) == "linux/arm/v7"
    with pytest.raises(ValueError):
        Platform.parse("amd64")


INDEX = {
    "mediaType": OCI_INDEX,
    "manifests": [
        {"digest": "sha256:aa", "platform": {"os": "unknown", "architecture": "unknown"},
         "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
        {"digest": "sha256:am", "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": "sha256:ar", "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
    ],
}


def test_select_platform_skips_attestations_and_matches_variant():
    entry, check = select_platform(INDEX, "linux/arm64")
    assert entry["digest"] == "sha256:ar" and check.verdict == "pass"
    assert "1 attestation entry ignored" in check.detail
    entry, check = select_platform(INDEX, "linux/arm64/v8")
    assert entry["digest"] == "sha256:ar"
    entry, check = select_platform(INDEX, "linux/riscv64")
    assert entry is None and check.verdict == "fail" and "linux/amd64" in check.observed


def test_entry_without_platform_counts_as_amd64():
    entry, _ = select_platform({"manifests": [{"digest": "sha256:x"}]}, "linux/amd64")
    assert entry["digest"] == "sha256:x"


def test_config_platform_cross_check_normalises_aarch64():
    assert check_config_platform("linux/arm64", {"os": "linux", "architecture": "aarch64"}).verdict == "pass"
    bad = check_config_platform("linux/amd64", {"os": "linux", "architecture": "arm64"})
    assert bad.verdict == "fail" and bad.observed == "linux/arm64"


def test_parse_manifest_kinds_and_rejections():
    assert parse_manifest(json.dumps(INDEX).encode(), OCI_INDEX)[0] == "index"
    image = {"schemaVersion": 2, "config": {}, "layers": []}
    assert parse_manifest(json.dumps(image).encode(), "application/json")[0] == "image"
    with pytest.raises(ManifestError, match="disagrees"):
        parse_manifest(json.dumps(INDEX).encode(), DOCKER_MANIFEST)
    with pytest.raises(ManifestError, match="schema1"):
        parse_manifest(b'{"schemaVersion": 1}', "application/json")
    with pytest.raises(ManifestError):
        parse_manifest(b"not json", OCI_INDEX)


def test_layer_checks():
    assert check_layer_count(48, 20).verdict == "pass"
    assert check_layer_count(1, 20).verdict == "fail"
    assert check_largest_layer(3_460_000_000, 8_000_000_000, 4_000_000_000).verdict == "pass"
    assert check_largest_layer(7_480_000_000, 8_000_000_000, 4_000_000_000).verdict == "warn"
    assert check_largest_layer(16_600_000_000, 8_000_000_000, 4_000_000_000).verdict == "fail"
    assert check_diff_ids(2, {"rootfs": {"diff_ids": ["a", "b"]}}).verdict == "pass"
    assert check_diff_ids(2, {"rootfs": {"diff_ids": ["a"]}}).verdict == "fail"
    assert check_diff_ids(1, {}).verdict == "fail"


def test_label_checks_report_both_values():
    missing = check_label("org.marin.harbor-commit", "b" * 40, {})
    assert missing.verdict == "fail" and missing.observed == "missing" and "b" * 40 in missing.detail
    wrong = check_label("org.opencontainers.image.revision", "a" * 40, {"org.opencontainers.image.revision": "c"})
    assert wrong.verdict == "fail" and "'c'" in wrong.detail and "a" * 40 in wrong.detail
    from_annotation = check_label("k", "v", {}, {"k": "v"})
    assert from_annotation.verdict == "pass" and "annotation" in from_annotation.detail


def _report(checks, anonymous):
    return ValidationReport(image_ref="h/r", tag="t", digest="sha256:1", platform="linux/amd64", layer_count=1,
                            largest_layer_bytes=1, total_bytes=1, anonymous_pull=anonymous, labels={},
                            checks=checks)


def test_report_ok_and_blocked_on_visibility():
    good = CheckResult(name="layer_count", expected="", observed="", verdict="pass")
    warn = CheckResult(name="largest_layer", expected="", observed="", verdict="warn")
    anon_fail = CheckResult(name="anonymous_pull", expected="", observed="", verdict="fail")
    anon_pass = anon_fail.model_copy(update={"verdict": "pass"})
    assert _report([good, warn, anon_pass], "pullable").ok
    blocked = _report([good, warn, anon_fail], "not_anonymously_pullable")
    assert not blocked.ok and blocked.blocked_on_visibility
    bad = CheckResult(name="diff_ids", expected="", observed="", verdict="fail")
    assert not _report([bad, anon_fail], "not_anonymously_pullable").blocked_on_visibility
    assert not _report([], None).ok
    inconclusive = anon_fail.model_copy(update={"verdict": "inconclusive"})
    assert not _report([good, inconclusive], "inconclusive").ok
