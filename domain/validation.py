"""Checks on a published image and the report they add up to (pure: parsed JSON in, verdicts out).

Why pure: the registry client fetches bytes; deciding whether those bytes are a pinnable GPU-RL image
(platform, layer shape, provenance labels, anonymous pull) is domain logic that must be testable
without a registry. Descriptor sizes are *compressed* sizes; ceilings are stated that way.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Verdict = Literal["pass", "fail", "warn", "inconclusive"]
AnonymousPull = Literal["pullable", "not_anonymously_pullable", "inconclusive"]
ManifestKind = Literal["index", "image"]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_SCHEMA1 = ("application/vnd.docker.distribution.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v1+prettyjws")
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
MANIFEST_ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))

LABEL_SOURCE = "org.opencontainers.image.source"
LABEL_REVISION = "org.opencontainers.image.revision"
LABEL_HARBOR = "org.marin.harbor-commit"
ATTESTATION_ANNOTATION = "vnd.docker.reference.type"

_ARCH_ALIASES = {"aarch64": "arm64", "x86_64": "amd64", "x86-64": "amd64", "armhf": "arm", "armel": "arm"}


class ManifestError(ValueError):
    """The manifest bytes are not a supported image manifest or index."""


class CheckResult(BaseModel):
    name: str
    expected: str
    observed: str
    verdict: Verdict
    detail: str = ""


class ExpectedImage(BaseModel):
    """What a published GPU-RL image must look like; ``None`` expectations are not checked."""

    model_config = ConfigDict(frozen=True)

    platform: str  # "linux/amd64" | "linux/arm64" (optionally "/variant")
    source_url: str | None = "https://github.com/marin-community/MarinSkyRL"
    revision: str | None = None  # build commit (GITSHA)
    harbor_commit: str | None = None
    min_layers: int = 20
    max_layer_bytes: int = 8_000_000_000  # compressed; >= this never pulls reliably
    warn_layer_bytes: int = 4_000_000_000  # compressed; a 7.48 GB layer already EOFed on RNO


class ValidationReport(BaseModel):
    image_ref: str  # repository (host/name)
    tag: str
    digest: str | None  # top-level digest (index digest for an index): what a pin should use
    platform: str | None
    layer_count: int | None
    largest_layer_bytes: int | None
    total_bytes: int | None
    anonymous_pull: AnonymousPull | None
    labels: dict[str, str]
    checks: list[CheckResult]
    media_type: str | None = None
    platform_digest: str | None = None  # the per-arch image manifest digest (evidence)

    @property
    def ok(self) -> bool:
        """Every check passed (warnings allowed); an inconclusive check is not ok."""
        return bool(self.checks) and all(c.verdict in ("pass", "warn") for c in self.checks)

    @property
    def blocked_on_visibility(self) -> bool:
        """The image is fine but the package is not anonymously pullable (a human must flip it public)."""
        others = [c for c in self.checks if c.name != "anonymous_pull"]
        return (self.anonymous_pull == "not_anonymously_pullable" and bool(others)
                and all(c.verdict in ("pass", "warn") for c in others))

    @property
    def pinned_ref(self) -> str | None:
        return f"{self.image_ref}@{self.digest}" if self.digest else None

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if c.verdict in ("fail", "inconclusive")]

    @property
    def awaiting_registry(self) -> bool:
        """Some check could not be decided (registry 5xx/429, network) and none failed for good: ask again
        later. A private package (anonymous pull refused) is not a failure for good either."""
        final = [c for c in self.checks if c.verdict == "fail" and c.name != "anonymous_pull"]
        return any(c.verdict == "inconclusive" for c in self.checks) and not final

    def failure_summary(self) -> str:
        """Every failing or inconclusive check, with what was expected and observed."""
        return "; ".join(f"{c.name} expected {c.expected}, observed {c.observed}"
                         + (" (inconclusive: no verdict from the registry)" if c.verdict == "inconclusive" else "")
                         for c in self.failures()) or "no checks ran"


# --- platforms ------------------------------------------------------------------------------------


class Platform(BaseModel):
    model_config = ConfigDict(frozen=True)

    os: str
    architecture: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        parts = text.strip().lower().split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"platform must be os/arch[/variant], got {text!r}")
        return cls.normalized(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    @classmethod
    def normalized(cls, os_: str | None, arch: str | None, variant: str | None = None) -> Platform:
        """containerd rules: aarch64→arm64, x86_64→amd64, arm64 with no variant is v8."""
        a = _ARCH_ALIASES.get((arch or "").lower(), (arch or "").lower())
        v = (variant or "").lower() or None
        if a == "arm64" and v is None:
            v = "v8"
        return cls(os=(os_ or "").lower(), architecture=a, variant=v)

    def matches(self, target: Platform) -> bool:
        """os and arch must be equal; variant only if the target names one (crane matchesPlatform)."""
        if (self.os, self.architecture) != (target.os, target.architecture):
            return False
        return target.variant is None or target.variant == self.variant

    def __str__(self) -> str:
        default_variant = self.architecture == "arm64" and self.variant == "v8"
        if self.variant and not default_variant:
            return f"{self.os}/{self.architecture}/{self.variant}"
        return f"{self.os}/{self.architecture}"


def _target_variant_explicit(target: str) -> Platform:
    """Parse a target, keeping its variant only when the caller spelled one."""
    parts = target.strip().lower().split("/")
    p = Platform.parse(target)
    return p if len(parts) == 3 else p.model_copy(update={"variant": None})


def descriptor_platform(entry: dict[str, Any]) -> Platform:
    """An index entry's platform; an entry without one counts as linux/amd64."""
    p = entry.get("platform") or {"os": "linux", "architecture": "amd64"}
    return Platform.normalized(p.get("os"), p.get("architecture"), p.get("variant"))


def is_attestation(entry: dict[str, Any]) -> bool:
    annotations = entry.get("annotations") or {}
    if annotations.get(ATTESTATION_ANNOTATION) == "attestation-manifest":
        return True
    p = entry.get("platform") or {}
    return p.get("os") == "unknown" and p.get("architecture") == "unknown"


# --- manifest parsing ------------------------------------------------------------------------------


def parse_manifest(data: bytes, media_type: str) -> tuple[ManifestKind, dict[str, Any]]:
    """Classify raw manifest bytes as an index or image manifest; reject schema1 and type mismatches."""
    try:
        body = json.loads(data)
    except ValueError as e:
        raise ManifestError(f"manifest is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ManifestError("manifest is not a JSON object")
    if body.get("schemaVersion") == 1 or media_type in DOCKER_SCHEMA1:
        raise ManifestError("Docker schema1 manifests are not supported")
    declared = body.get("mediaType")
    if declared and media_type not in ("", "application/json") and declared != media_type:
        raise ManifestError(f"Content-Type {media_type!r} disagrees with body mediaType {declared!r}")
    kind_type = declared or media_type
    if kind_type in INDEX_TYPES:
        return "index", body
    if kind_type in MANIFEST_TYPES:
        return "image", body
    if kind_type in ("", "application/json"):
        if "manifests" in body:
            return "index", body
        if "config" in body and "layers" in body:
            return "image", body
    raise ManifestError(f"unsupported manifest media type {kind_type!r}")


def platform_entries(index: dict[str, Any]) -> list[dict[str, Any]]:
    """Index entries that are images (attestations removed)."""
    return [m for m in index.get("manifests") or [] if not is_attestation(m)]


def select_platform(index: dict[str, Any], target: str) -> tuple[dict[str, Any] | None, CheckResult]:
    """Pick the index entry for ``target``; the check says which platforms the index offers."""
    want = _target_variant_explicit(target)
    entries = platform_entries(index)
    offered = [str(descriptor_platform(m)) for m in entries]
    skipped = len(index.get("manifests") or []) - len(entries)
    note = f"; {skipped} attestation entr{'y' if skipped == 1 else 'ies'} ignored" if skipped else ""
    for m in entries:
        if descriptor_platform(m).matches(want):
            return m, CheckResult(name="platform", expected=target, observed=str(descriptor_platform(m)),
                                  verdict="pass", detail=f"index offers {offered}{note}")
    return None, CheckResult(name="platform", expected=target, observed=", ".join(offered) or "none",
                             verdict="fail", detail=f"no index entry for {target}{note}")


# --- checks -----------------------------------------------------------------------------------------


def check_digest(tag: str, digest: str | None, detail: str = "") -> CheckResult:
    ok = bool(digest) and digest.count(":") == 1
    return CheckResult(name="digest", expected=f"digest of tag {tag}", observed=digest or "unresolved",
                       verdict="pass" if ok else "fail", detail=detail)


def check_manifest_kind(kind: ManifestKind, media_type: str, entries: int | None = None) -> CheckResult:
    detail = f"{media_type}" + (f" with {entries} image entr{'y' if entries == 1 else 'ies'}" if entries else "")
    if kind == "index" and not entries:
        return CheckResult(name="manifest_kind", expected="image manifest or index with an image entry",
                           observed="index without image entries", verdict="fail", detail=detail)
    return CheckResult(name="manifest_kind", expected="image manifest or index with an image entry",
                       observed=kind, verdict="pass", detail=detail)


def check_single_platform(target: str) -> CheckResult:
    """A plain image manifest has no platform of its own; the config decides (see check_config_platform)."""
    return CheckResult(name="platform", expected=target, observed="single image manifest", verdict="pass",
                       detail="platform taken from the image config")


def check_config_platform(target: str, config: dict[str, Any]) -> CheckResult:
    """Cross-check the image config's os/architecture/variant against the target platform."""
    got = Platform.normalized(config.get("os"), config.get("architecture"), config.get("variant"))
    ok = got.matches(_target_variant_explicit(target))
    raw = "/".join(x for x in (config.get("os"), config.get("architecture"), config.get("variant")) if x)
    return CheckResult(name="config_platform", expected=target, observed=str(got) if got.os else "missing",
                       verdict="pass" if ok else "fail", detail=f"config os/architecture/variant: {raw or 'none'}")


def check_entry_matches_config(entry: dict[str, Any], config: dict[str, Any]) -> CheckResult:
    """The index entry's platform must agree with the config it points at."""
    declared = descriptor_platform(entry)
    got = Platform.normalized(config.get("os"), config.get("architecture"), config.get("variant"))
    ok = (declared.os, declared.architecture) == (got.os, got.architecture) and (
        declared.variant == got.variant or None in (declared.variant, got.variant))
    return CheckResult(name="index_entry_platform", expected=str(declared), observed=str(got),
                       verdict="pass" if ok else "fail", detail="index entry platform vs image config")


def check_layer_count(count: int, min_layers: int) -> CheckResult:
    return CheckResult(name="layer_count", expected=f">= {min_layers}", observed=str(count),
                       verdict="pass" if count >= min_layers else "fail")


def check_largest_layer(largest: int, max_bytes: int, warn_bytes: int) -> CheckResult:
    expected = f"< {max_bytes} compressed bytes (warn above {warn_bytes})"
    if largest >= max_bytes:
        verdict: Verdict = "fail"
        detail = "a layer this large restarts and EOFs on pull; rebuild with per-RUN layers"
    elif largest > warn_bytes:
        verdict, detail = "warn", "large layer: pulls may be fragile"
    else:
        verdict, detail = "pass", ""
    return CheckResult(name="largest_layer", expected=expected, observed=str(largest), verdict=verdict,
                       detail=detail)


def check_diff_ids(layer_count: int, config: dict[str, Any]) -> CheckResult:
    diff_ids = ((config.get("rootfs") or {}).get("diff_ids")) or []
    return CheckResult(name="diff_ids", expected=f"{layer_count} diff_ids (one per layer)",
                       observed=str(len(diff_ids)), verdict="pass" if len(diff_ids) == layer_count else "fail")


def check_label(key: str, expected: str, labels: dict[str, str], annotations: dict[str, str] | None = None
                ) -> CheckResult:
    """A config label must equal ``expected``; manifest annotations are a fallback source."""
    source = "config label"
    value = labels.get(key)
    if value is None and annotations and key in annotations:
        value, source = annotations[key], "manifest annotation"
    if value is None:
        return CheckResult(name=f"label:{key}", expected=expected, observed="missing", verdict="fail",
                           detail=f"label {key} is missing (expected {expected})")
    ok = value == expected
    detail = f"from {source}" if ok else f"{source} {key}={value!r}, expected {expected!r}"
    return CheckResult(name=f"label:{key}", expected=expected, observed=value,
                       verdict="pass" if ok else "fail", detail=detail)


def check_anonymous_pull(verdict: AnonymousPull, detail: str) -> CheckResult:
    mapping: dict[str, Verdict] = {"pullable": "pass", "not_anonymously_pullable": "fail",
                                   "inconclusive": "inconclusive"}
    return CheckResult(name="anonymous_pull", expected="pullable", observed=verdict,
                       verdict=mapping[verdict], detail=detail)


def layer_stats(manifest: dict[str, Any]) -> tuple[int, int, int]:
    """(count, largest, total) compressed sizes from an image manifest's layer descriptors."""
    sizes = [int(layer.get("size") or 0) for layer in manifest.get("layers") or []]
    return len(sizes), max(sizes, default=0), sum(sizes)


def config_labels(config: dict[str, Any]) -> dict[str, str]:
    """``config.Labels`` (may be null or absent)."""
    labels = (config.get("config") or {}).get("Labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def check_claimed_digest(report: ValidationReport, claimed: str | None) -> ValidationReport:
    """The digest the build log claims it pushed must be the one the registry serves for the tag (the
    top-level digest, or the platform manifest's under an index); otherwise the validation fails naming both."""
    if not claimed or not report.digest:
        return report
    same = claimed in (report.digest, report.platform_digest)
    check = CheckResult(name="pushed_digest", expected=f"{claimed} (what this job pushed: its log, or the image "
                        "judged for its lost log)", observed=report.digest,
                        verdict="pass" if same else "fail",
                        detail="" if same else f"this job pushed {claimed} (its log, or the image judged for it) but "
                        f"the registry serves {report.digest} for {report.image_ref}:{report.tag}")
    return report.model_copy(update={"checks": [*report.checks, check]})

