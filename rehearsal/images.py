"""The registry look-up of every image a build pulls, before anything is submitted (I/O).

Why: kaniko pulls each base (and crane each image the script reads) only after the job was scheduled on a
48–96-core host; a tag or digest that does not exist, an image with no manifest for the target's platform,
or a private base the job has no credentials for fails there. The rehearsal records which images the build
pulls (rehearsal/model.py ``image_reads``: FROMs after ARG expansion, full `COPY --from` references, crane
reads); this asks each one's registry, as kaniko and crane would, for the target's platform.

How: the project's registry client (clients/registry.py: the WWW-Authenticate Bearer/Basic token flow,
digests verified against the bytes, bounded retries with backoff on 5xx, 429 and network errors). Docker
Hub names are Docker's (``nvidia/cuda`` is ``registry-1.docker.io/nvidia/cuda``, ``ubuntu`` is
``library/ubuntu``: rehearsal/task_image.py ``parse_image_reference``). A registry with a mirror
(``policy.rehearsal_registry_mirrors``, as containerd and Docker read a pull-through cache) is asked through
it. Anonymous, except the host of ``registry.image_repository``, which gets the job's own credentials
(registry.user/registry.token), as the job's docker config does: a credential never goes to another host.

A registry that does not answer after the retries leaves the reference "unchecked" with the reason: never
a pass and never a refusal as missing (rehearsal/model.py ``image_refusal`` decides what that means).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from clients.registry import (
    Denied,
    DigestMismatch,
    NotFound,
    ProtocolError,
    RateLimited,
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    Unauthorized,
    scheme_for,
)
from domain.buildset import TargetSpec
from domain.contract import BuildContract
from domain.markers import variant_env
from domain.validation import ManifestError, Platform, parse_manifest, select_platform
from rehearsal.model import expected_build_args, image_refusal, planned_image_reads
from rehearsal.result import ImageCheck, ImageRead, RehearsalResult
from rehearsal.task_image import DOCKER_HUB, DOCKER_HUB_API, parse_image_reference

MIRRORS_KEY = "policy.rehearsal_registry_mirrors"
LOOKUP_TIMEOUT_S = 60.0  # one reference's whole look-up (every retry included)
CONCURRENCY = 4


class CredentialUnavailable(RuntimeError):
    """The job's registry credentials could not be read (the message says why; never the value)."""


@dataclass
class LookupSettings:
    """Where and how to ask. ``job_host``: the host of registry.image_repository, the only one that gets
    ``job_credentials``; ``credentials_error``: why they could not be read (a refusal there is then
    unchecked, not "unauthorized")."""

    mirrors: dict[str, str] = field(default_factory=dict)
    insecure_hosts: tuple[str, ...] = ()
    job_host: str | None = None
    job_credentials: tuple[str, str] | None = None
    credentials_error: str | None = None
    realm_hosts: tuple[str, ...] = ()  # registry.token_realm_hosts
    max_retries: int = 3
    timeout_s: float = 20.0
    lookup_timeout_s: float = LOOKUP_TIMEOUT_S
    transport: httpx.AsyncBaseTransport | None = None
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


def _route(registry: str, s: LookupSettings) -> tuple[str, bool, str]:
    """(host asked, whether the job's credentials go there, how it was asked: for the report)."""
    mirror = s.mirrors.get(registry)
    host = mirror or (DOCKER_HUB_API if registry == DOCKER_HUB else registry)
    own = mirror is None and s.job_host is not None and host.lower() == s.job_host.lower()
    via = f"the mirror of {registry} ({MIRRORS_KEY})" if mirror else registry
    how = ("with the job's credentials (registry.user/registry.token)" if own and s.job_credentials
           else "anonymously")
    return host, own, f"asked {scheme_for(host, s.insecure_hosts)}://{host}, {via}, {how}"


async def check_images(reads: list[ImageRead], settings: LookupSettings) -> list[ImageCheck]:
    """The registry's answer for each read, in order (each distinct reference and platform asked once)."""
    clients: dict[tuple[str, bool], RegistryClient] = {}
    answers: dict[tuple[str, str | None], asyncio.Task[ImageCheck]] = {}
    gate = asyncio.Semaphore(CONCURRENCY)

    def client(host: str, own: bool) -> RegistryClient:
        key = (host, own)
        if key not in clients:
            creds = settings.job_credentials if own else None
            clients[key] = RegistryClient(
                host, scheme=scheme_for(host, settings.insecure_hosts), credentials=creds,
                transport=settings.transport, max_retries=settings.max_retries, timeout_s=settings.timeout_s,
                trusted_realm_hosts=settings.realm_hosts if creds else (), sleep=settings.sleep)
        return clients[key]

    async def one(read: ImageRead) -> ImageCheck:
        async with gate:
            try:
                ref = parse_image_reference(read.reference)
            except ValueError as e:
                return ImageCheck(read=read, status="unchecked", answer=str(e), asked="not asked")
            host, own, asked = _route(ref.registry, settings)
            try:
                return await asyncio.wait_for(_look_up(client(host, own), ref.repository, ref.ref, read, asked),
                                              settings.lookup_timeout_s)
            except TimeoutError:
                return ImageCheck(read=read, status="unchecked", asked=asked,
                                  answer=f"no answer within {settings.lookup_timeout_s:g} s")
            except (NotFound, DigestMismatch) as e:
                what = {"NAME_UNKNOWN": "no such repository", "MANIFEST_UNKNOWN": "no such tag or digest"}.get(
                    e.code or "", "not found") if isinstance(e, NotFound) else "the digest does not match"
                return ImageCheck(read=read, status="missing", answer=f"{what} ({e})", asked=asked)
            except (Unauthorized, Denied) as e:
                if own and settings.job_credentials is None:
                    return ImageCheck(read=read, status="unchecked", asked=asked, answer=(
                        f"refused anonymously ({e}), and the job's credentials could not be read: "
                        f"{settings.credentials_error or 'not configured'}"))
                who = "to the job's credentials" if own and settings.job_credentials else (
                    "anonymously (the job has credentials only for registry.image_repository's host)")
                return ImageCheck(read=read, status="unauthorized", asked=asked,
                                  answer=f"refused {who}: private, or no such repository ({e})")
            except (RegistryUnavailable, RateLimited, ProtocolError, RegistryError, httpx.HTTPError, OSError,
                    ValueError, KeyError, TypeError) as e:  # ValueError: ManifestError, a config that is no JSON
                return ImageCheck(read=read, status="unchecked", asked=asked,
                                  answer=f"{type(e).__name__}: {e or 'no detail'} (after {settings.max_retries} "
                                         "retries with backoff)")

    try:
        for r in reads:
            key = (r.reference, r.platform)
            if key not in answers:
                answers[key] = asyncio.ensure_future(one(r))
        done = {k: await t for k, t in answers.items()}
    finally:
        for c in clients.values():
            await c.aclose()
    out = []
    for r in reads:
        c = done[(r.reference, r.platform)]
        out.append(c if c.read == r else c.model_copy(update={"read": r}))
    return out


async def _look_up(client: RegistryClient, repo: str, ref: str, read: ImageRead, asked: str) -> ImageCheck:
    """The manifest of ``repo:ref`` (a digest is verified against the bytes), and for a platform the index
    entry for it (whose manifest must exist too) or, for a single image manifest, its config's platform."""
    raw = await client.get_manifest(repo, ref)
    kind, body = parse_manifest(raw.data, raw.media_type)
    if read.platform is None:
        return ImageCheck(read=read, status="found", answer=f"{kind} {raw.digest}", asked=asked, digest=raw.digest)
    if kind == "index":
        entry, check = select_platform(body, read.platform)
        if entry is None:
            return ImageCheck(read=read, status="no_platform", asked=asked,
                              answer=f"its index ({raw.digest[:19]}) has no manifest for {read.platform}: it offers "
                                     f"{check.observed}")
        found = await client.head_manifest(repo, str(entry["digest"]))
        return ImageCheck(read=read, status="found", answer=f"index entry {found.digest}", asked=asked,
                          digest=found.digest)
    config = (body.get("config") or {}).get("digest")
    if not config:
        raise ManifestError("image manifest without a config")
    cfg = json.loads(await client.get_blob(repo, str(config)))
    have = Platform.normalized(cfg.get("os"), cfg.get("architecture"), cfg.get("variant"))
    if not have.matches(Platform.parse(read.platform)):
        return ImageCheck(read=read, status="no_platform", asked=asked,
                          answer=f"it is a single {have} image ({raw.digest[:19]}), no manifest for {read.platform}")
    return ImageCheck(read=read, status="found", answer=f"image {raw.digest}", asked=asked, digest=raw.digest)


def asks_job_host(reference: str, settings: LookupSettings) -> bool:
    """Whether looking ``reference`` up goes to registry.image_repository's host (with the job's credentials)."""
    try:
        registry = parse_image_reference(reference).registry
    except ValueError:
        return False
    return _route(registry, settings)[1]


async def check_target_images(contract: BuildContract, targets: list[TargetSpec], settings: LookupSettings, *,
                              harbor_commit: str, mode: str, accept_unrehearsed: bool,
                              credentials: Callable[[], Awaitable[tuple[str, str]]] | None = None) -> str | None:
    """Look up every image each target's build pulls (``t.rehearsal.images``: what the rehearsal recorded;
    where it could not run, the planned final build's bases), store the answers in ``t.rehearsal.image_checks``
    and return the plan's refusal (rehearsal/model.py ``image_refusal``), else None. ``credentials`` is
    called only when a reference is on the job's own registry host."""
    for t in targets:
        if t.rehearsal is None:
            t.rehearsal = RehearsalResult(status="skipped", reason="no rehearsal ran")
        df = contract.dockerfiles.get(t.dockerfile)
        if not t.rehearsal.images and t.rehearsal.status == "skipped" and not t.rehearsal.unrehearsed_from \
                and df is not None:
            args = expected_build_args(t, harbor_commit=harbor_commit, build_commit=contract.commit,
                                       wheel_source_var=contract.script.wheel_source_var,
                                       megatron=variant_env(contract, t.variant))
            t.rehearsal.images = planned_image_reads(t, df, {k: v for k, (v, _) in args.items()})
    if credentials is not None and settings.job_credentials is None and any(
            asks_job_host(r.reference, settings) for t in targets for r in t.rehearsal.images):
        try:
            settings.job_credentials = await credentials()
        except CredentialUnavailable as e:
            settings.credentials_error = str(e)
    found = await asyncio.gather(*(check_images(t.rehearsal.images, settings) for t in targets))
    for t, checks in zip(targets, found, strict=True):
        t.rehearsal.image_checks = checks
    return image_refusal(targets, mode=mode, accept_unrehearsed=accept_unrehearsed)
