"""Shared plumbing for activities: paths under the work dir, Iris clients, contract loading, files.

Why: every activity class reads the same configuration and needs the same few things (a mirror of
the source repos, the contract at an exact commit, an Iris client for a cluster, the evidence store
for large files whose URI and digest go into history). Keeping them here keeps activities thin.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from temporalio import activity

from activities.errors import InputError, boundary
from clients.credentials import CredentialError, fetch_secret
from clients.evidence import EvidenceStore
from clients.git_source import FetchedRepo, MirrorCache, list_files_at, read_blobs_at
from clients.github_app import register_private_key
from clients.identity import git_credential
from clients.iris import IrisClient
from clients.kube import KubectlPortForward
from clients.registry import RegistryPool
from domain.config import ServiceConfig, safe_name
from domain.models import FileRef
from domain.redact import redact_obj, redact_value

CONTRACT_PATHS = ("AGENTS.md", ".agents/ops/gpu-rl-image-build.md", "docker/build_gpu_rl_kaniko.sh")
# Every activity heartbeats this often while it runs (workflows/options.py sizes heartbeat timeouts to it),
# so a step whose worker died is retried within seconds, not after its start-to-close timeout.
HEARTBEAT_EVERY_S = 2.0


def input_error(message: str) -> InputError:
    """Bad input or contract: never retried; the message names the file/field/flag."""
    return InputError(message)


class Paths:
    def __init__(self, config: ServiceConfig):
        self.root = Path(config.work_dir).expanduser()

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors"

    def worktree(self, request_id: str) -> Path:
        return self.root / "worktrees" / safe_name(request_id)

    def bundle(self, request_id: str, commit: str) -> Path:
        return self.root / "bundles" / safe_name(request_id) / f"{commit[:12]}.zip"


async def write_evidence(store: EvidenceStore, request_id: str, name: str, text: str) -> FileRef:
    """Write a (redacted) evidence file to the store, off the event loop, and return its reference."""
    return await asyncio.to_thread(store.put_text, request_id, name, text)


async def write_json_evidence(store: EvidenceStore, request_id: str, name: str, obj) -> FileRef:
    return await write_evidence(store, request_id, name, json.dumps(obj, indent=2, sort_keys=True, default=str))


class SourceRepos:
    """Fresh mirrors of MarinSkyRL and Harbor, and the contract files at an exact commit.

    ``git_credential``: what every fetch and push authenticates with (clients/identity.py), read at run
    time and offered only to the configured GitHub's host."""

    def __init__(self, config: ServiceConfig, paths: Paths):
        self.config = config
        self.git_credential = git_credential(config)
        self.cache = MirrorCache(paths.mirrors, credential=self.git_credential)

    def marinskyrl(self) -> FetchedRepo:
        return self.cache.fetch(self.config.repos.marinskyrl_url)

    def harbor(self) -> FetchedRepo:
        return self.cache.fetch(self.config.repos.harbor_url)

    @staticmethod
    def contract_files(repo: FetchedRepo, sha: str) -> dict[str, bytes]:
        """The build script, every docker/Dockerfile*, and the ops doc and AGENTS.md when present, at ``sha``.

        Bytes: ``load_contract`` decodes them and names the file it cannot read (never retried).
        The prose files may be absent; the configuration then supplies what they would state.
        """
        files = read_blobs_at(repo, sha, [p for p in CONTRACT_PATHS if p.startswith("docker/")])
        files.update(read_blobs_at(repo, sha, [p for p in CONTRACT_PATHS if not p.startswith("docker/")],
                                   missing_ok=True))
        dockerfiles = [p for p in list_files_at(repo, sha, "docker") if Path(p).name.startswith("Dockerfile")]
        files.update(read_blobs_at(repo, sha, dockerfiles))
        return files


class ActivityGroup:
    """Activities that share the configuration, the work-dir layout and the source mirrors.

    Every ``@activity.defn`` method of a subclass is re-defined (same name) to run behind the error
    boundary (activities/errors.py) and to heartbeat in the background, so no activity can forget either.
    """

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        for attr, value in list(vars(cls).items()):
            defn = getattr(value, "__temporal_activity_definition", None)
            if defn is None or getattr(value, "__activity_boundary__", False):
                continue
            wrapped = boundary(_redacting(_heartbeating(value)))
            wrapped.__dict__.pop("__temporal_activity_definition", None)  # copied by functools.wraps
            setattr(cls, attr, activity.defn(name=defn.name)(wrapped))

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.paths = Paths(config)
        self.repos = SourceRepos(config, self.paths)
        self.evidence = EvidenceStore(config.evidence_url(), config.evidence.storage_options,
                                      before_write=self.learn_secrets)
        # One connection pool per worker for every registry read (validation, anonymous probe).
        self.registry_pool = RegistryPool(realm_hosts=tuple(config.registry.token_realm_hosts))

    def all(self) -> list:
        raise NotImplementedError

    _learned_at: float | None = None

    def learn_secrets_once(self, max_age_s: float = 300.0) -> None:
        """``learn_secrets`` at most every ``max_age_s`` (a credential command is not run per activity)."""
        now = time.monotonic()
        if self._learned_at is None or now - self._learned_at > max_age_s:
            self.learn_secrets()
            self._learned_at = now

    def learn_secrets(self) -> None:
        """Fetch every configured credential now so ``redact`` knows its current value, whichever
        process fetched it for the job (a worker that took over after a crash never did). Values are
        only registered; one that cannot be read cannot have reached a log through us either."""
        for key, source in self.config.credential_sources().items():
            if source.kind == "literal_public":
                continue
            try:
                value = fetch_secret(source, what=key)
            except CredentialError:
                continue
            if key == "github.app.private_key":
                register_private_key(value)  # each line too: a log that cut the PEM leaks none of it


@contextlib.asynccontextmanager
async def iris_client(config: ServiceConfig, cluster_name: str, *,
                      transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[IrisClient]:
    """An Iris client for a configured cluster: a direct URL, or a kubectl port-forward we own.
    ``transport``: an httpx transport to send through (None: plain HTTP)."""
    cluster = config.cluster(cluster_name)
    async with contextlib.AsyncExitStack() as stack:
        if cluster.controller_url:
            url = cluster.controller_url
        elif cluster.port_forward:
            pf = cluster.port_forward
            url = await stack.enter_async_context(KubectlPortForward(
                cluster.kubeconfig, cluster.kube_context, namespace=pf.namespace, service=pf.service, port=pf.port,
                kubectl=cluster.kubectl))
        else:
            raise input_error(f"clusters.{cluster_name}: set controller_url or port_forward")
        # A controller that requires a bearer gets clusters.<name>.token, read now and never persisted.
        token = fetch_secret(cluster.token, what=f"clusters.{cluster_name}.token") if cluster.token else None
        client = IrisClient(url, client_revision_date=cluster.client_revision_date, cluster_name=cluster_name,
                            token=token, transport=transport)
        stack.push_async_callback(client.aclose)
        yield client


def _redacting(fn):
    """Every activity result passes through ``redact_value`` before it becomes a history payload, after
    this process learned every configured credential (a worker that took over never fetched them)."""
    @functools.wraps(fn)
    async def run(self, *args, **kwargs):
        result = await fn(self, *args, **kwargs)
        if isinstance(self, ActivityGroup):
            await asyncio.to_thread(self.learn_secrets_once)
        return redact_value(result)
    return run


def _heartbeating(fn):
    @functools.wraps(fn)
    async def run(*args, **kwargs):
        async with Heartbeater(HEARTBEAT_EVERY_S):
            return await fn(*args, **kwargs)
    return run


# The latest details this activity reported, shared by every background Heartbeater it runs (the one
# every activity is wrapped in and any nested one), so a background beat repeats what the activity last
# said instead of overwriting it with nothing: the UI's pending activity shows the watch's state.
_LATEST: contextvars.ContextVar[list | None] = contextvars.ContextVar("heartbeat_latest", default=None)


def heartbeat(details: object = None) -> None:
    """Heartbeat now with ``details`` (redacted), and make them what the background beats repeat."""
    cell = _LATEST.get()
    if cell is not None:
        cell[0] = details
    if activity.in_activity():
        activity.heartbeat(redact_obj(details))


class Heartbeater:
    """Heartbeat in the background while a long step runs (PostHog's pattern), with the latest details:
    those set on ``details`` or reported by ``heartbeat`` anywhere in the activity."""

    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        self._cell: list = [None]
        self._token: contextvars.Token | None = None
        self._task: asyncio.Task | None = None

    @property
    def details(self) -> object:
        return self._cell[0]

    @details.setter
    def details(self, value: object) -> None:
        self._cell[0] = value

    async def _loop(self) -> None:
        while True:
            if activity.in_activity():
                activity.heartbeat(redact_obj(self.details))
            await asyncio.sleep(self.every_s)

    async def __aenter__(self) -> Heartbeater:
        shared = _LATEST.get()
        if shared is None:
            self._token = _LATEST.set(self._cell)
        else:
            self._cell = shared
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._token is not None:
            with contextlib.suppress(ValueError):  # exited in another context: nothing of ours to undo
                _LATEST.reset(self._token)
