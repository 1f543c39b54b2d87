"""Validate a published image against what the build promised (Temporal-free orchestration).

Why separate from the client: this decides the order of reads (tag → digest → manifest by digest →
platform child → config) and turns registry errors into check verdicts, so a transient registry
problem reads "inconclusive" and never "private" or "bad image".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from clients.registry import (
    Denied,
    NotFound,
    ProtocolError,
    RateLimited,
    RawManifest,
    RegistryClient,
    RegistryError,
    RegistryPool,
    RegistryUnavailable,
    Unauthorized,
    scheme_for,
    split_image_repository,
)
from domain.validation import (
    LABEL_HARBOR,
    LABEL_REVISION,
    LABEL_SOURCE,
    AnonymousPull,
    CheckResult,
    ExpectedImage,
    ManifestError,
    ValidationReport,
    check_anonymous_pull,
    check_config_platform,
    check_diff_ids,
    check_digest,
    check_entry_matches_config,
    check_label,
    check_largest_layer,
    check_layer_count,
    check_manifest_kind,
    check_single_platform,
    config_labels,
    descriptor_platform,
    layer_stats,
    parse_manifest,
    platform_entries,
    select_platform,
)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class AnonymousProbe:
    verdict: AnonymousPull
    step: str  # which step decided: "registry", "token", "network"
    detail: str


async def probe_anonymous_pull(host: str, repo: str, ref: str, *, scheme: Literal["https", "http"] = "https",
                               transport: httpx.AsyncBaseTransport | None = None, sleep: Sleep = asyncio.sleep,
                               max_retries: int = 2, pool: RegistryPool | None = None) -> AnonymousProbe:
    """GET the manifest with a FRESH client that has no credentials (registry.md §1.5 verdicts).

    Fresh means no credentials, tokens or cookies; it may borrow ``pool``'s connections, which carry none.
    """
    client = RegistryClient(host, scheme=scheme, credentials=None, transport=transport,
                            max_retries=max_retries, sleep=sleep, pool=pool)
    async with client:
        try:
            await client.get_manifest(repo, ref)
        except Unauthorized as e:
            if e.step == "token":
                why = "token endpoint refused an anonymous pull token (private, internal or missing)"
            elif e.scheme == "basic":
                why = "registry requires Basic credentials; there is no anonymous flow"
            elif e.error == "insufficient_scope":
                why = "registry refused the anonymous token (insufficient_scope)"
            else:
                why = "registry answered 401 to an anonymous request"
            return AnonymousProbe("not_anonymously_pullable", e.step, f"{why}: {e}")
        except Denied as e:
            return AnonymousProbe("not_anonymously_pullable", e.step, f"denied: {e}")
        except NotFound as e:
            return AnonymousProbe("not_anonymously_pullable", e.step,
                                  f"anonymous read found no such tag or repository: {e}")
        except (RateLimited, RegistryUnavailable) as e:
            return AnonymousProbe("inconclusive", e.step, f"transient registry problem: {e}")
        except RegistryError as e:
            return AnonymousProbe("inconclusive", e.step, f"unexpected registry reply: {e}")
        except httpx.HTTPError as e:
            return AnonymousProbe("inconclusive", "network", f"network error: {type(e).__name__}")
    return AnonymousProbe("pullable", "registry", f"anonymous GET {repo}@{ref} returned 200")


class _Inconclusive(Exception):
    def __init__(self, check: CheckResult) -> None:
        super().__init__(check.detail)
        self.check = check


def _error_check(name: str, expected: str, e: RegistryError) -> CheckResult:
    transient = isinstance(e, RateLimited | RegistryUnavailable)
    return CheckResult(name=name, expected=expected, observed=type(e).__name__,
                       verdict="inconclusive" if transient else "fail", detail=str(e))


async def validate_image(*, image_repository: str, tag: str, expected: ExpectedImage,
                         credentials: tuple[str, str] | None, insecure_hosts: Iterable[str] = (),
                         transport: httpx.AsyncBaseTransport | None = None, anonymous_attempts: int = 3,
                         anonymous_retry_delay_s: float = 5.0, sleep: Sleep = asyncio.sleep,
                         max_retries: int = 3, pool: RegistryPool | None = None,
                         on_config: Callable[[dict[str, Any]], None] | None = None) -> ValidationReport:
    """Resolve ``image_repository:tag`` and check platform, layers, labels and anonymous pull.

    ``on_config`` receives the image config once read (its history stands in for a lost build log,
    domain/log_evidence.py), without putting it in the report that goes to history.

    ``pool`` is the worker's shared connection pool; without one, a pool lives for this validation so
    the authenticated reads and the anonymous probe still share connections.
    """
    if pool is None:
        own = RegistryPool(transport=transport)
        try:
            return await validate_image(
                image_repository=image_repository, tag=tag, expected=expected, credentials=credentials,
                insecure_hosts=insecure_hosts, transport=transport, anonymous_attempts=anonymous_attempts,
                anonymous_retry_delay_s=anonymous_retry_delay_s, sleep=sleep, max_retries=max_retries, pool=own,
                on_config=on_config)
        finally:
            await own.aclose()
    host, repo = split_image_repository(image_repository)
    scheme = scheme_for(host, tuple(insecure_hosts))
    report = ValidationReport(image_ref=image_repository, tag=tag, digest=None, platform=None, layer_count=None,
                              largest_layer_bytes=None, total_bytes=None, anonymous_pull=None, labels={},
                              checks=[])
    async def anonymous(digest: str) -> AnonymousProbe:
        probe = AnonymousProbe("inconclusive", "none", "not attempted")
        for attempt in range(max(1, anonymous_attempts)):
            probe = await probe_anonymous_pull(host, repo, digest, scheme=scheme, transport=transport,
                                               sleep=sleep, max_retries=max_retries, pool=pool)
            if probe.verdict != "inconclusive":
                break
            if attempt + 1 < anonymous_attempts:
                await sleep(anonymous_retry_delay_s)
        return probe

    # The anonymous probe needs only the digest: it runs while the platform child and config are read.
    probe_task: asyncio.Task[AnonymousProbe] | None = None

    def start_probe(digest: str) -> None:
        nonlocal probe_task
        probe_task = asyncio.ensure_future(anonymous(digest))

    client = RegistryClient(host, scheme=scheme, credentials=credentials, transport=transport, sleep=sleep,
                            max_retries=max_retries, pool=pool)
    try:
        async with client:
            try:
                await _inspect(client, repo, tag, expected, report, on_digest=start_probe, on_config=on_config)
            except _Inconclusive as e:
                report.checks.append(e.check)
                return report
        if report.digest is None or probe_task is None:
            return report
        probe = await probe_task
    finally:
        if probe_task is not None and not probe_task.done():
            probe_task.cancel()
            await asyncio.gather(probe_task, return_exceptions=True)
    report.anonymous_pull = probe.verdict
    report.checks.append(check_anonymous_pull(probe.verdict, f"[{probe.step}] {probe.detail}"))
    return report


async def _inspect(client: RegistryClient, repo: str, tag: str, expected: ExpectedImage,
                   report: ValidationReport, on_digest: Callable[[str], None] = lambda _digest: None,
                   on_config: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Fill ``report`` step by step; a registry error ends the inspection with one check.

    The tag is resolved by GET, not HEAD: the digest is the sha256 of the bytes we then parse (and is
    cross-checked with Docker-Content-Digest), so one request gives both the digest and the manifest.
    """
    try:
        top = await client.get_manifest(repo, tag)
    except RegistryError as e:
        raise _Inconclusive(_error_check("digest", f"digest of tag {tag}", e)) from None
    report.digest = top.digest
    report.checks.append(check_digest(tag, top.digest, detail=f"GET {repo}:{tag}"))
    on_digest(top.digest)
    report.media_type = top.media_type
    try:
        kind, body = parse_manifest(top.data, top.media_type)
    except ManifestError as e:
        raise _Inconclusive(CheckResult(name="manifest_kind", expected="OCI/Docker image manifest or index",
                                        observed=top.media_type or "unknown", verdict="fail",
                                        detail=str(e))) from None
    entry: dict[str, Any] | None = None
    if kind == "index":
        report.checks.append(check_manifest_kind(kind, top.media_type, len(platform_entries(body))))
        entry, platform_check = select_platform(body, expected.platform)
        report.checks.append(platform_check)
        if entry is None:
            return
        child = await _manifest(client, repo, entry["digest"], "platform_manifest")
        try:
            child_kind, image = parse_manifest(child.data, child.media_type)
        except ManifestError as e:
            raise _Inconclusive(CheckResult(name="platform_manifest", expected="image manifest",
                                            observed=child.media_type, verdict="fail", detail=str(e))) from None
        if child_kind != "image":
            report.checks.append(CheckResult(name="platform_manifest", expected="image manifest",
                                             observed="nested index", verdict="fail"))
            return
        report.platform_digest = child.digest
    else:
        report.checks.append(check_manifest_kind(kind, top.media_type))
        report.checks.append(check_single_platform(expected.platform))
        image = body
        report.platform_digest = top.digest

    count, largest, total = layer_stats(image)
    report.layer_count, report.largest_layer_bytes, report.total_bytes = count, largest, total
    config_digest = (image.get("config") or {}).get("digest")
    if not config_digest:
        report.checks.append(CheckResult(name="config", expected="config descriptor", observed="missing",
                                         verdict="fail"))
        return
    try:
        config = json.loads(await client.get_blob(repo, config_digest))
    except RegistryError as e:
        raise _Inconclusive(_error_check("config", f"config blob {config_digest}", e)) from None
    except ValueError:
        report.checks.append(CheckResult(name="config", expected="JSON image config", observed="not JSON",
                                         verdict="fail"))
        return
    if on_config is not None and isinstance(config, dict):
        on_config(config)
    platform_check = check_config_platform(expected.platform, config)
    report.checks.append(platform_check)
    if entry is not None:
        report.checks.append(check_entry_matches_config(entry, config))
        report.platform = str(descriptor_platform(entry)) if platform_check.verdict == "pass" else \
            platform_check.observed
    else:
        report.platform = platform_check.observed
    report.checks.append(check_layer_count(count, expected.min_layers))
    report.checks.append(check_largest_layer(largest, expected.max_layer_bytes, expected.warn_layer_bytes))
    report.checks.append(check_diff_ids(count, config))

    report.labels = config_labels(config)
    annotations = {str(k): str(v) for k, v in (image.get("annotations") or {}).items()}
    for key, want in ((LABEL_SOURCE, expected.source_url), (LABEL_REVISION, expected.revision),
                      (LABEL_HARBOR, expected.harbor_commit)):
        if want is not None:
            report.checks.append(check_label(key, want, report.labels, annotations))


async def _manifest(client: RegistryClient, repo: str, digest: str, check_name: str) -> RawManifest:
    try:
        return await client.get_manifest(repo, digest)
    except ProtocolError as e:
        raise _Inconclusive(CheckResult(name=check_name, expected=f"manifest {digest}", observed="refused",
                                        verdict="fail", detail=str(e))) from None
    except RegistryError as e:
        raise _Inconclusive(_error_check(check_name, f"manifest {digest}", e)) from None
