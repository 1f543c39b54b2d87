"""Iris controller client: Iris's own protobuf messages as Connect JSON over httpx, typed, Temporal-free.

Targets ``iris.cluster.ControllerService`` of marin-iris 0.2.227 and the finelog log server behind the
controller's endpoint proxy (``/proxy/system.log-server/finelog.logging.LogService/FetchLogs``; 0.2.227
answers the old top-level ``/finelog.logging.LogService/FetchLogs`` with 404).

Why the generated classes (``iris.rpc.*_pb2``, ``finelog.rpc.logging_pb2``) and ``google.protobuf.json_format``
rather than hand-written dicts: every request is a message of the RPC's own request type (a field or enum
name that does not exist cannot be sent), and every reply is parsed into the RPC's reply type, so an
unknown enum value, a renamed field or a changed scalar type is a ``ParseError`` naming the field, not a
silent default. The worker image installs marin-iris and marin-finelog without their dependencies
(docker/install.py): importing the pb2 modules needs ``protobuf`` alone. The transport stays httpx behind
``clients/http_guard.py`` (allowed host, body caps, timeouts).

A reply is parsed strictly first; when that fails only because the controller sends a field or an enum
value this marin-iris does not know (a newer controller), it is parsed again ignoring those, and the
difference is recorded in ``IrisClient.drift`` and logged once (tests/contract drives the client with
replies of modified protos and reports every such line). A reply that does not parse even then (a changed
scalar type) raises ``Internal`` naming the message and the field.

Secrets: a LaunchSpec's env goes only into the LaunchJob body. ``GetJobStatus`` echoes the launch
request (env included) as ``request``; that field is dropped from the reply before it is parsed, logged
or put in an exception, and error messages from a launch are scrubbed of the spec's env values.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from enum import StrEnum
from typing import Any, Literal

import httpx
from finelog.rpc import logging_pb2
from google.protobuf import json_format
from google.protobuf.message import Message
from iris.rpc import controller_pb2, job_pb2, time_pb2
from pydantic import BaseModel, ConfigDict, Field, field_validator

from clients import http_guard
from clients.iris_pin import IRIS_REVISION_DATE, IRIS_VERSION
from domain.credential_hosts import host_of

JOB_NAME_RE = re.compile(r"^/[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)+$")
_log = logging.getLogger(__name__)
Controller = controller_pb2.Controller


class JobState(StrEnum):
    """``iris.job.JobState`` by short name (``JOB_STATE_RUNNING`` → ``running``); the contract test checks
    the two agree value for value."""

    UNSPECIFIED = "unspecified"
    PENDING = "pending"
    BUILDING = "building"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    WORKER_FAILED = "worker_failed"
    UNSCHEDULABLE = "unschedulable"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_JOB

    @classmethod
    def parse(cls, raw: Any) -> JobState:
        return _parse_enum(cls, raw, "JOB_STATE_", job_pb2.JobState)


class TaskState(StrEnum):
    """``iris.job.TaskState`` by short name."""

    UNSPECIFIED = "unspecified"
    PENDING = "pending"
    BUILDING = "building"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    WORKER_FAILED = "worker_failed"
    UNSCHEDULABLE = "unschedulable"
    ASSIGNED = "assigned"
    PREEMPTED = "preempted"
    COSCHED_FAILED = "cosched_failed"
    MISSING = "missing"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_TASK

    @classmethod
    def parse(cls, raw: Any) -> TaskState:
        return _parse_enum(cls, raw, "TASK_STATE_", job_pb2.TaskState)


_TERMINAL_JOB = {
    JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.WORKER_FAILED, JobState.UNSCHEDULABLE
}
_TERMINAL_TASK = {
    TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED, TaskState.UNSCHEDULABLE,
    TaskState.WORKER_FAILED, TaskState.PREEMPTED, TaskState.COSCHED_FAILED,
}


def _parse_enum(cls, raw: Any, prefix: str, proto_enum):
    """A state number (as the parsed message holds it) or name → the short-name enum; a number this
    marin-iris does not know → UNSPECIFIED (the parse already recorded it as drift)."""
    if raw is None or raw == "":
        return cls.UNSPECIFIED
    if isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit()):
        try:
            raw = proto_enum.Name(int(raw))
        except ValueError:
            return cls.UNSPECIFIED
    try:
        return cls(str(raw).upper().removeprefix(prefix).lower())
    except ValueError:
        return cls.UNSPECIFIED


def _ts_ms(ts) -> int | None:
    """An ``iris.time.Timestamp`` / ``finelog.logging.Timestamp`` → epoch ms, None when unset or zero."""
    return ts.epoch_ms or None


def parse_message(data: dict, cls: type[Message], *, strict: bool = True) -> Message:
    """``data`` (a Connect JSON reply) as a ``cls`` message; ``strict``: unknown fields and enum values are a
    ``json_format.ParseError``."""
    msg = cls()
    json_format.ParseDict(data, msg, ignore_unknown_fields=not strict)
    return msg


def wire(msg: Message) -> dict:
    """A request message as the Connect JSON body (camelCase names, int64 as strings, enums by name)."""
    return json_format.MessageToDict(msg)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class AttemptInfo(_Model):
    attempt_id: int
    state: TaskState
    exit_code: int | None = None
    error: str = ""
    worker_id: str = ""
    is_worker_failure: bool = False
    attempt_uid: str = ""
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    pod_name: str | None = None
    node_name: str | None = None
    terminal_reason: str | None = None

    @classmethod
    def from_proto(cls, a: job_pb2.TaskAttempt) -> AttemptInfo:
        state = TaskState.parse(a.state)
        return cls(
            attempt_id=a.attempt_id,
            state=state,
            exit_code=a.exit_code if state.is_terminal else None,
            error=a.error,
            worker_id=a.worker_id,
            is_worker_failure=a.is_worker_failure,
            attempt_uid=a.attempt_uid,
            started_at_ms=_ts_ms(a.started_at),
            finished_at_ms=_ts_ms(a.finished_at),
            pod_name=a.pod_name or None,
            node_name=a.node_name or None,
            terminal_reason=a.terminal_reason or None,
        )


class TaskInfo(_Model):
    task_id: str
    state: TaskState
    exit_code: int | None = None  # None until the task is terminal
    error: str = ""
    worker_id: str = ""
    container_id: str = ""  # Docker id locally; the pod name on Kubernetes
    current_attempt_id: int = 0
    pending_reason: str = ""
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    attempts: list[AttemptInfo] = Field(default_factory=list)

    @classmethod
    def from_proto(cls, t: job_pb2.TaskStatus) -> TaskInfo:
        state = TaskState.parse(t.state)
        return cls(
            task_id=t.task_id,
            state=state,
            exit_code=t.exit_code if state.is_terminal else None,
            error=t.error,
            worker_id=t.worker_id,
            container_id=t.container_id,
            current_attempt_id=t.current_attempt_id,
            pending_reason=t.pending_reason,
            started_at_ms=_ts_ms(t.started_at),
            finished_at_ms=_ts_ms(t.finished_at),
            attempts=[AttemptInfo.from_proto(a) for a in t.attempts],
        )

    @classmethod
    def from_wire(cls, d: dict) -> TaskInfo:
        """A Connect JSON ``iris.job.TaskStatus`` (fields and enum values this marin-iris lacks ignored)."""
        return cls.from_proto(parse_message(d, job_pb2.TaskStatus, strict=False))


class JobInfo(_Model):
    """A job's status. ``exit_code`` comes from its tasks (the job-level field stays 0 on failure).

    The controller's echo of the launch request (``request``, which carries job env vars) is never
    kept here."""

    job_id: str
    state: JobState
    exit_code: int | None = None
    error: str = ""
    pending_reason: str = ""
    submitted_at_ms: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    failure_count: int = 0
    preemption_count: int = 0
    task_count: int = 0
    completed_count: int = 0
    task_state_counts: dict[str, int] = Field(default_factory=dict)
    parent_job_id: str = ""
    tasks: list[TaskInfo] = Field(default_factory=list)  # latest attempt per task (ListTasks)

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal

    @classmethod
    def from_proto(cls, job: job_pb2.JobStatus, tasks: list[TaskInfo] | None = None) -> JobInfo:
        tasks = tasks or []
        return cls(
            job_id=job.job_id,
            state=JobState.parse(job.state),
            exit_code=exit_code_from_tasks(tasks),
            error=job.error,
            pending_reason=job.pending_reason,
            submitted_at_ms=_ts_ms(job.submitted_at),
            started_at_ms=_ts_ms(job.started_at),
            finished_at_ms=_ts_ms(job.finished_at),
            failure_count=job.failure_count,
            preemption_count=job.preemption_count,
            task_count=job.task_count,
            completed_count=job.completed_count,
            task_state_counts=dict(job.task_state_counts),
            parent_job_id=job.parent_job_id,
            tasks=tasks,
        )

    @classmethod
    def from_wire(cls, job: dict, tasks: list[TaskInfo] | None = None) -> JobInfo:
        """A Connect JSON ``iris.job.JobStatus`` (fields and enum values this marin-iris lacks ignored)."""
        return cls.from_proto(parse_message(job, job_pb2.JobStatus, strict=False), tasks)


def exit_code_from_tasks(tasks: list[TaskInfo]) -> int | None:
    """The first non-zero terminal task exit code; 0 when all tasks ended with 0; None otherwise."""
    codes = [t.exit_code for t in tasks if t.exit_code is not None]
    if not codes:
        return None
    return next((c for c in codes if c != 0), 0)


class LogEntry(_Model):
    ts_ms: int | None
    key: str = ""
    task_id: str = ""
    attempt_id: int = 0
    source: str = ""  # "stdout" / "stderr" / ...
    level: str = ""
    data: str = ""
    # The store's row id (0.2.227): one counter for every key, from 1; a job's ids are contiguous only while
    # nothing else writes, and lines its worker's log client dropped never got one (domain/log_evidence.py).
    # A FetchLogs cursor is the last seq seen.
    seq: int = 0

    @classmethod
    def from_proto(cls, e: logging_pb2.LogEntry) -> LogEntry:
        return cls(
            ts_ms=_ts_ms(e.timestamp),
            key=e.key,
            task_id=e.key.rsplit(":", 1)[0] if ":" in e.key else e.key,
            attempt_id=e.attempt_id,
            source=e.source,
            level=logging_pb2.LogLevel.Name(e.level).removeprefix("LOG_LEVEL_") if e.level else "",
            data=e.data,
            seq=e.seq,
        )


class LogPage(_Model):
    entries: list[LogEntry] = Field(default_factory=list)
    cursor: int = 0  # pass back as ``cursor`` to continue after the last entry

    @property
    def lines(self) -> list[str]:
        return [e.data for e in self.entries]


# finelog's client buffers log lines and flushes them every second (finelog.client.log_client
# DEFAULT_FLUSH_INTERVAL); on 0.2.227 a task's last lines can reach the log store after the job is terminal.
LOG_FLUSH_INTERVAL_S = 1.0


class CompleteLog(_Model):
    """A job's whole log, read until it stopped growing (``complete``) or the bound ran out."""

    entries: list[LogEntry] = Field(default_factory=list)
    cursor: int = 0
    complete: bool = False
    reads: int = 0
    waited_s: float = 0.0

    @property
    def lines(self) -> list[str]:
        return [e.data for e in self.entries]


class GpuRequest(_Model):
    variant: str  # e.g. "H100", "GB200"
    count: int = 1


class Resources(_Model):
    cpu_millicores: int = 1000
    memory_bytes: int = 1024**3
    disk_bytes: int = 5 * 1024**3
    gpu: GpuRequest | None = None

    def to_proto(self) -> job_pb2.ResourceSpecProto:
        device = (job_pb2.DeviceConfig(gpu=job_pb2.GpuDevice(variant=self.gpu.variant, count=self.gpu.count))
                  if self.gpu else job_pb2.DeviceConfig(cpu=job_pb2.CpuDevice(variant="cpu")))
        return job_pb2.ResourceSpecProto(cpu_millicores=self.cpu_millicores, memory_bytes=self.memory_bytes,
                                         disk_bytes=self.disk_bytes, device=device)

    def to_wire(self) -> dict:
        return wire(self.to_proto())


PriorityBandName = Literal["production", "interactive", "batch"]
ExistingJobPolicyName = Literal["keep", "error", "recreate", "unspecified"]


def _duration(seconds: float) -> time_pb2.Duration:
    return time_pb2.Duration(milliseconds=int(seconds * 1000))


class LaunchSpec(_Model):
    """One LaunchJob request. ``env`` and ``bundle_blob`` are kept out of repr (env holds secrets).

    No setup commands are ever sent (no ``uv sync``): the command runs directly."""

    name: str  # full wire id: /<user>/<job>
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    bundle_blob: bytes | None = Field(default=None, repr=False)
    bundle_id: str | None = None
    resources: Resources = Resources()
    replicas: int = Field(default=1, ge=1)
    max_retries_failure: int = Field(default=0, ge=0)
    # Job-level failure budget. None: equal to ``max_retries_failure``, as ``iris job run --max-retries N``
    # sends it (iris/cli/job.py: max_retries_failure=N, max_task_failures=N); 0.2.227 fails a job whose
    # failed tasks exceed it even while the task still has retries left.
    max_task_failures: int | None = Field(default=None, ge=0)
    max_retries_preemption: int = Field(default=1000, ge=0)
    timeout_s: float | None = None  # per task
    scheduling_timeout_s: float | None = None
    priority_band: PriorityBandName | None = None
    task_image: str | None = None
    existing_job_policy: ExistingJobPolicyName = "keep"
    client_revision_date: str | None = None  # overrides the client's date (clients/iris_pin.py)

    @field_validator("name")
    @classmethod
    def _full_wire_id(cls, v: str) -> str:
        if not JOB_NAME_RE.match(v) or len(v) > 200:
            raise ValueError(f"job name must be a full wire id '/<user>/<job>', got {v!r}")
        return v

    @field_validator("argv")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("argv must not be empty")
        return v

    @property
    def user(self) -> str:
        return self.name.split("/")[1]

    def to_proto(self, default_revision_date: str) -> Controller.LaunchJobRequest:
        req = Controller.LaunchJobRequest(
            name=self.name,
            entrypoint=job_pb2.RuntimeEntrypoint(run_command=job_pb2.CommandEntrypoint(argv=list(self.argv))),
            resources=self.resources.to_proto(),
            environment=job_pb2.EnvironmentConfig(env_vars=dict(self.env)),
            replicas=self.replicas,
            max_retries_failure=self.max_retries_failure,
            max_task_failures=(self.max_retries_failure if self.max_task_failures is None
                               else self.max_task_failures),
            max_retries_preemption=self.max_retries_preemption,
            existing_job_policy=job_pb2.ExistingJobPolicy.Value(
                f"EXISTING_JOB_POLICY_{self.existing_job_policy.upper()}"),
            client_revision_date=self.client_revision_date or default_revision_date,
        )
        if self.bundle_blob is not None:
            req.bundle_blob = self.bundle_blob
        elif self.bundle_id:
            req.bundle_id = self.bundle_id
        if self.timeout_s:
            req.timeout.CopyFrom(_duration(self.timeout_s))
        if self.scheduling_timeout_s:
            req.scheduling_timeout.CopyFrom(_duration(self.scheduling_timeout_s))
        if self.priority_band:
            req.priority_band = job_pb2.PriorityBand.Value(f"PRIORITY_BAND_{self.priority_band.upper()}")
        if self.task_image:
            req.task_image = self.task_image
        return req

    def to_wire(self, default_revision_date: str) -> dict:
        return wire(self.to_proto(default_revision_date))


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------


class IrisError(Exception):
    """Base of every error this client raises. ``code`` is the Connect code (``transport`` for
    connection failures); ``message`` never holds env values or tokens."""

    transient = False

    def __init__(self, method: str, code: str, message: str, http_status: int | None = None):
        self.method = method
        self.code = code
        self.message = message
        self.http_status = http_status
        super().__init__(f"Iris {method}: {code}: {message}")


class NotFound(IrisError):
    pass


class AlreadyExists(IrisError):
    pass


class InvalidArgument(IrisError):
    pass


class FailedPrecondition(IrisError):
    pass


class ClientTooOld(FailedPrecondition):
    """The controller's freshness gate rejected our ``client_revision_date``: one message naming the
    marin-iris this client was built against, the date it sent, and the upgrade."""

    def __init__(self, method: str, code: str, message: str, http_status: int | None, *,
                 revision_date: str, cluster_name: str, overridden: bool = False):
        source = (f"clusters.{cluster_name}.client_revision_date (a configured override; remove it to send "
                  f"marin-iris {IRIS_VERSION}'s {IRIS_REVISION_DATE})" if overridden
                  else f"the build date of marin-iris {IRIS_VERSION}, which this client was tested against")
        super().__init__(
            method,
            code,
            f"the controller of cluster {cluster_name} refuses this client as too old: it sent "
            f"client_revision_date {revision_date} ({source}); the controller says: {message}. Upgrade "
            f"gpu-rl-builder to a newer marin-iris release (docs/iris-upgrade.md) and redeploy the worker.",
            http_status,
        )
        self.revision_date = revision_date


class PermissionDenied(IrisError):
    pass


class ResourceExhausted(IrisError):
    transient = True


class Unavailable(IrisError):
    """Controller unreachable or overloaded (also transport errors and deadline_exceeded).
    Never a statement about the job: callers keep the last known state."""

    transient = True


class LogServerUnavailable(Unavailable):
    """A log read found no log server behind the controller's endpoint proxy: ``/proxy/system.log-server/...``
    answered 404 (``/system/log-server`` not registered at the moment, or not this controller's public
    listener answering). Says nothing about the job: transient like any unavailability (retried with
    backoff, then reported as logs not read), never a missing job or a lost log."""


class Internal(IrisError):
    pass


_ERRORS_BY_CODE: dict[str, type[IrisError]] = {
    "not_found": NotFound,
    "already_exists": AlreadyExists,
    "invalid_argument": InvalidArgument,
    "out_of_range": InvalidArgument,
    "failed_precondition": FailedPrecondition,
    "permission_denied": PermissionDenied,
    "unauthenticated": PermissionDenied,
    "resource_exhausted": ResourceExhausted,
    "unavailable": Unavailable,
    "deadline_exceeded": Unavailable,
    "aborted": Unavailable,
    "internal": Internal,
    "unknown": Internal,
    "unimplemented": NotFound,
    "data_loss": Internal,
    "canceled": Unavailable,
}
_CODE_BY_HTTP = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
                 409: "already_exists", 429: "resource_exhausted", 502: "unavailable", 503: "unavailable",
                 504: "deadline_exceeded"}


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret value (4+ chars) in ``text`` with ``[REDACTED]``."""
    for value in sorted((v for v in secrets if v and len(v) >= 4), key=len, reverse=True):
        text = text.replace(value, "[REDACTED]")
    return text


# ---------------------------------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------------------------------

CONTROLLER_SERVICE = "iris.cluster.ControllerService"
LOG_SERVICE = "finelog.logging.LogService"
# The controller proxies endpoint ``/system/log-server`` at ``/proxy/system.log-server`` (marin-iris:
# ``rigging.connect.proxy_path(iris.cluster.endpoints.LOG_SERVER_ENDPOINT_NAME)``; the contract test
# checks this equals it).
LOG_SERVER_PROXY_PREFIX = "/proxy/system.log-server"
# Reply caps (bytes read before a reply is refused): an RPC reply (a ListJobs page of 500 jobs, a FetchLogs
# page of 5,000 lines) stays far below 64 MiB; /health answers a few bytes.
MAX_REPLY_BYTES = 64 * 1024 * 1024
MAX_HEALTH_BYTES = 64 * 1024
LIST_JOBS_PAGE = 500
LIST_JOBS_MAX_OFFSET = 5000
_ARCH_ATTRIBUTE_KEYS = ("arch", "architecture", "cpu-arch", "cpu_arch", "kubernetes.io/arch", "machine")
_ARCH_ALIASES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class IrisClient:
    """Async client for one controller URL (direct, or a ``KubectlPortForward`` URL).

    Retries only transient failures (Unavailable, ResourceExhausted, transport) with bounded backoff,
    and never retries LaunchJob: ``submit_idempotent`` looks the job up instead."""

    def __init__(
        self,
        base_url: str,
        *,
        client_revision_date: str | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        launch_timeout_s: float = 180.0,
        cluster_name: str = "<name>",
        max_attempts: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        # None: the build date of the marin-iris this client was tested against, as `iris job run` sends it.
        self.client_revision_date = client_revision_date or IRIS_REVISION_DATE
        self._revision_overridden = client_revision_date is not None and client_revision_date != IRIS_REVISION_DATE
        self.cluster_name = cluster_name
        self._timeout_s = timeout_s
        self._launch_timeout_s = launch_timeout_s
        self._max_attempts = max(1, max_attempts)
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # The token goes to this controller only (over TLS unless loopback); a reply stops at its cap.
        self._http = http_guard.async_client(
            allowed_hosts=(host_of(self.base_url),), credential=f"clusters.{cluster_name}.token",
            max_body_bytes=MAX_REPLY_BYTES, base_url=self.base_url, headers=headers, timeout=timeout_s,
            transport=transport)
        self.requests: Counter[str] = Counter()  # RPC method -> requests sent (retries included)
        # "<RPC>: <ParseError>" -> replies that parsed only by ignoring what this marin-iris does not know
        self.drift: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"IrisClient({self.base_url!r}, cluster={self.cluster_name!r})"

    async def __aenter__(self) -> IrisClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- transport ----------------------------------------------------------------------------------

    async def _post_once(self, path: str, method: str, body: dict, timeout_s: float | None,
                         secrets: Iterable[str] = ()) -> dict:
        self.requests[method] += 1
        try:
            r = await self._http.post(path, json=body, timeout=timeout_s or self._timeout_s)
        except httpx.TransportError as e:  # connect/read errors and timeouts
            raise Unavailable(method, "transport", f"cannot reach controller ({type(e).__name__})") from None
        except (http_guard.ResponseTooLarge, http_guard.CredentialRefused) as e:  # not transient: a retry reads it again
            raise Internal(method, "internal", str(e)) from None
        if r.status_code == 200:
            try:
                reply = r.json()
            except ValueError:
                raise Internal(method, "internal", "controller returned a non-JSON reply", 200) from None
            if not isinstance(reply, dict):
                raise Internal(method, "internal", "controller returned a JSON reply that is not an object", 200)
            return reply
        code, message = _CODE_BY_HTTP.get(r.status_code, "internal"), f"HTTP {r.status_code}"
        try:
            err = r.json()
            code = str(err.get("code") or code)
            # Connect errors carry "message"; the controller's endpoint proxy answers {"error": "..."}.
            message = str(err.get("message") or err.get("error") or message)
        except (ValueError, AttributeError):
            pass
        message = scrub(message[:2000], secrets)
        if code == "failed_precondition" and "too old" in message:
            raise ClientTooOld(method, code, message, r.status_code, revision_date=self.client_revision_date,
                               cluster_name=self.cluster_name, overridden=self._revision_overridden)
        error = _ERRORS_BY_CODE.get(code, Internal)
        if error is NotFound and path.startswith(f"{LOG_SERVER_PROXY_PREFIX}/"):
            raise LogServerUnavailable(
                method, "unavailable", f"no log server answers behind the controller's endpoint proxy "
                f"({LOG_SERVER_PROXY_PREFIX}: HTTP {r.status_code} {code}: {message}); the job's logs are unread, "
                f"nothing is concluded about the job", r.status_code)
        raise error(method, code, message, r.status_code)

    async def _call(self, method: str, body: dict, *, service: str = CONTROLLER_SERVICE, prefix: str = "",
                    retry: bool = True, timeout_s: float | None = None, secrets: Iterable[str] = ()) -> dict:
        path = f"{prefix}/{service}/{method}"
        attempts = self._max_attempts if retry else 1
        delay = self._backoff_s
        for attempt in range(1, attempts + 1):
            try:
                return await self._post_once(path, method, body, timeout_s, secrets)
            except IrisError as e:
                if not e.transient or attempt == attempts:
                    raise
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, self._max_backoff_s)
        raise AssertionError("unreachable")

    async def _rpc(self, method: str, request: Message, reply_cls: type[Message], *,
                   drop: tuple[str, ...] = (), **kw: Any):
        """One RPC: ``request`` as Connect JSON, the reply parsed into ``reply_cls``. ``drop``: reply keys
        removed before parsing (never parsed, logged or quoted)."""
        reply = await self._call(method, wire(request), **kw)
        for key in drop:
            reply.pop(key, None)
        return self._parse(method, reply, reply_cls)

    def _parse(self, method: str, reply: dict, reply_cls: type[Message]):
        try:
            return parse_message(reply, reply_cls)
        except json_format.ParseError as e:
            strict_error = str(e).splitlines()[0]  # the next line lists every known field
        try:
            msg = parse_message(reply, reply_cls, strict=False)
        except json_format.ParseError as e:
            raise Internal(method, "internal", f"the reply does not match {reply_cls.DESCRIPTOR.full_name} of "
                           f"marin-iris {IRIS_VERSION}: {e} (docs/iris-upgrade.md)") from None
        key = f"{method}: {strict_error}"
        if key not in self.drift:
            _log.warning("Iris %s on cluster %s sent what marin-iris %s does not know (ignored): %s; "
                         "see docs/iris-upgrade.md", method, self.cluster_name, IRIS_VERSION, strict_error)
        self.drift[key] += 1
        return msg

    # -- jobs ---------------------------------------------------------------------------------------

    async def launch_job(self, spec: LaunchSpec) -> str:
        """One LaunchJob call, never retried (a lost reply may still have created the job)."""
        reply = await self._rpc("LaunchJob", spec.to_proto(self.client_revision_date), Controller.LaunchJobResponse,
                                retry=False, timeout_s=self._launch_timeout_s, secrets=spec.env.values())
        return reply.job_id or spec.name

    async def submit_idempotent(self, spec: LaunchSpec) -> tuple[str, bool]:
        """Attach to an existing job of this name whatever its state, else launch it.

        Returns ``(job_id, launched)``. A finished job is never silently replaced. If the LaunchJob
        reply is lost (Unavailable), the job is looked up again before the error is re-raised."""
        try:
            await self.job_status(spec.name, with_tasks=False)
            return spec.name, False
        except NotFound:
            pass
        spec = spec.model_copy(update={"existing_job_policy": "keep"})
        try:
            return await self.launch_job(spec), True
        except (Unavailable, AlreadyExists):
            try:
                await self.job_status(spec.name, with_tasks=False)
            except NotFound:
                raise
            return spec.name, False

    async def job_status(self, job_id: str, *, with_tasks: bool = True) -> JobInfo:
        """GetJobStatus (the echoed ``request`` is dropped unread) plus ListTasks for real exit codes."""
        reply = await self._rpc("GetJobStatus", Controller.GetJobStatusRequest(job_id=job_id),
                                Controller.GetJobStatusResponse, drop=("request",))
        if not reply.HasField("job") or not reply.job.job_id:
            raise NotFound("GetJobStatus", "not_found", f"job {job_id} not found")
        tasks = await self.list_tasks(job_id) if with_tasks else []
        return JobInfo.from_proto(reply.job, tasks)

    async def job_states(self, job_ids: list[str]) -> dict[str, JobState]:
        """GetJobState: the states of many jobs in one request (one SQL read on the controller, no tasks,
        no attempts). Unknown ids are left out: absence alone is not proof (confirm with job_status)."""
        reply = await self._rpc("GetJobState", Controller.GetJobStateRequest(job_ids=list(job_ids)),
                                Controller.GetJobStateResponse)
        return {k: JobState.parse(v) for k, v in reply.states.items()}

    async def list_jobs(self, prefix: str | None = None, state: JobState | str | None = None,
                        limit: int = 1000, newest_first: bool = False,
                        before_page: Callable[[], Awaitable[None]] | None = None) -> list[JobInfo]:
        """All users' jobs (optionally by anchored id prefix and short state name), paging through;
        ``newest_first``: by submission date, newest first (JOB_SORT_FIELD_DATE, SORT_DIRECTION_DESC).
        ``before_page`` is awaited before each page's request (the watcher's status window: every page
        is a request of its budget)."""
        jobs: list[JobInfo] = []
        offset = 0
        while len(jobs) < limit and offset <= LIST_JOBS_MAX_OFFSET:
            if before_page is not None:
                await before_page()
            page, more = await self.list_jobs_page(prefix, state, offset=offset,
                                                   limit=min(LIST_JOBS_PAGE, limit - len(jobs)),
                                                   newest_first=newest_first)
            jobs.extend(page)
            await asyncio.sleep(0)  # a long listing parses page by page, never in one stretch of the loop
            offset += len(page)
            if not page or not more:
                break
        return jobs[:limit]

    async def list_jobs_page(self, prefix: str | None = None, state: JobState | str | None = None, *,
                             offset: int = 0, limit: int = LIST_JOBS_PAGE,
                             newest_first: bool = False) -> tuple[list[JobInfo], bool]:
        """One ``ListJobs`` request: the page at ``offset`` and whether more follow (``has_more``)."""
        query = Controller.JobQuery(offset=offset, limit=min(LIST_JOBS_PAGE, limit))
        if prefix:
            query.job_id_prefix = prefix
        if state:
            query.state_filter = str(JobState(state) if not isinstance(state, JobState) else state)
        if newest_first:
            query.sort_field = Controller.JOB_SORT_FIELD_DATE
            query.sort_direction = Controller.SORT_DIRECTION_DESC
        reply = await self._rpc("ListJobs", Controller.ListJobsRequest(query=query), Controller.ListJobsResponse)
        return [JobInfo.from_proto(j) for j in reply.jobs], bool(reply.has_more)

    async def list_tasks(self, job_id: str) -> list[TaskInfo]:
        """Tasks with their latest attempt only (an unknown job gives an empty list)."""
        reply = await self._rpc("ListTasks", Controller.ListTasksRequest(job_id=job_id), Controller.ListTasksResponse)
        return [TaskInfo.from_proto(t) for t in reply.tasks]

    async def task_status(self, task_id: str) -> TaskInfo:
        """One task with its full attempt history."""
        reply = await self._rpc("GetTaskStatus", Controller.GetTaskStatusRequest(task_id=task_id),
                                Controller.GetTaskStatusResponse)
        if not reply.HasField("task") or not reply.task.task_id:
            raise NotFound("GetTaskStatus", "not_found", f"task {task_id} not found")
        return TaskInfo.from_proto(reply.task)

    async def terminate(self, job_id: str) -> None:
        """TerminateJob: running → KILLED; finished → no-op; unknown → NotFound."""
        await self._rpc("TerminateJob", Controller.TerminateJobRequest(job_id=job_id), job_pb2.Empty)

    # -- logs ---------------------------------------------------------------------------------------

    async def fetch_logs(
        self,
        source: str,
        match_scope: Literal["exact", "prefix", "regex"] = "prefix",
        since_ms: int | None = None,
        cursor: int | None = None,
        max_lines: int | None = None,
        tail: bool = False,
        substring: str | None = None,
        min_level: str | None = None,
        until_cursor: int | None = None,
    ) -> LogPage:
        """FetchLogs. Keys are ``/<user>/<job>/<task>:<attempt>``: a job is ``"/u/j/"`` PREFIX, a task
        ``"/u/j/0:"`` PREFIX, an attempt ``"/u/j/0:1"`` EXACT. ``cursor``/``since_ms`` are exclusive."""
        request = logging_pb2.FetchLogsRequest(
            source=source, match_scope=logging_pb2.MatchScope.Value(f"MATCH_SCOPE_{match_scope.upper()}"),
            tail=tail, since_ms=since_ms or 0, cursor=cursor or 0, max_lines=max_lines or 0,
            substring=substring or "", min_level=min_level or "", until_cursor=until_cursor or 0)
        reply = await self._rpc("FetchLogs", request, logging_pb2.FetchLogsResponse, service=LOG_SERVICE,
                                prefix=LOG_SERVER_PROXY_PREFIX)
        return LogPage(entries=[LogEntry.from_proto(e) for e in reply.entries], cursor=reply.cursor or cursor or 0)

    async def stored_rows_between(self, after: int, before: int, *, page_lines: int = 5000) -> int:
        """How many rows of ANY key the store holds with ``after`` < seq < ``before``.

        Why: ``seq`` is one counter for the whole store, so a gap between two lines of a job is normally
        other jobs' lines; only ids that no key holds are rows the store lost (domain/log_evidence.py)."""
        count, cursor = 0, after
        while cursor < before - 1:
            page = await self.fetch_logs("/", "prefix", cursor=cursor, until_cursor=before,
                                         max_lines=min(page_lines, before - cursor - 1))
            ids = [e.seq for e in page.entries if after < e.seq < before]
            if not ids:
                break
            count += len(ids)
            cursor = max(ids)
        return count

    async def read_complete_log(
        self,
        source: str,
        match_scope: Literal["exact", "prefix", "regex"] = "prefix",
        *,
        quiet_s: float = 2 * LOG_FLUSH_INTERVAL_S,
        poll_s: float = LOG_FLUSH_INTERVAL_S,
        max_wait_s: float = 30.0,
        page_lines: int = 5000,
        on_read: Any = None,
        start: CompleteLog | None = None,
    ) -> CompleteLog:
        """Every entry of ``source``, re-read after the job is terminal until nothing new arrived for
        ``quiet_s`` (two finelog flush intervals), at most ``max_wait_s``.

        Why: on 0.2.227 lines still buffered in the worker's finelog client reach the store after the
        terminal state (measured: up to 1.8 s); a log read once at terminal can miss the final push
        line or a failure's last lines. ``complete`` is False when the log still grew at the bound:
        callers must not decide an outcome on it. ``on_read(n_entries)`` is called after every page
        (activities heartbeat there).

        ``start``: what an earlier read got (its entries and cursor): only lines after its cursor are read,
        and nothing at all when it was complete (a terminal job's complete log does not grow again)."""
        if start is not None and start.complete:
            return start.model_copy(update={"reads": 0, "waited_s": 0.0})
        loop = asyncio.get_running_loop()
        started = last_growth = loop.time()
        entries: list[LogEntry] = list(start.entries) if start is not None else []
        cursor = start.cursor if start is not None else 0
        reads = 0
        while True:
            while True:  # drain everything after ``cursor``
                page = await self.fetch_logs(source, match_scope, cursor=cursor, max_lines=page_lines)
                reads += 1
                grew = bool(page.entries) and page.cursor != cursor
                if grew:
                    entries.extend(page.entries)
                    cursor = page.cursor
                    last_growth = loop.time()
                if on_read is not None:
                    on_read(len(entries))
                if not grew or len(page.entries) < page_lines:
                    break
            now = loop.time()
            if now - last_growth >= quiet_s or now - started >= max_wait_s:
                return CompleteLog(entries=entries, cursor=cursor, complete=now - last_growth >= quiet_s,
                                   reads=reads, waited_s=round(now - started, 3))
            await asyncio.sleep(min(poll_s, max(0.05, quiet_s - (now - last_growth))))

    # -- cluster ------------------------------------------------------------------------------------

    async def health(self) -> bool:
        """``GET /health`` answered ``{"status":"ok"}``; False when unreachable or unhealthy. A reply past
        ``MAX_HEALTH_BYTES`` raises ``Internal`` naming the URL and the cap (only the cap is read)."""
        try:
            r = await self._http.get("/health", timeout=min(self._timeout_s, 10.0),
                                     extensions={http_guard.BODY_CAP: MAX_HEALTH_BYTES})
            return r.status_code == 200 and r.json().get("status") == "ok"
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        except (http_guard.ResponseTooLarge, http_guard.CredentialRefused) as e:
            raise Internal("health", "internal", str(e)) from None

    async def workers(self) -> list[Controller.WorkerHealthStatus]:
        reply = await self._rpc("ListWorkers", Controller.ListWorkersRequest(query=Controller.WorkerQuery()),
                                Controller.ListWorkersResponse)
        return list(reply.workers)

    async def list_workers(self) -> list[dict]:
        """The registered workers as Connect JSON objects (for display)."""
        return [json_format.MessageToDict(w) for w in await self.workers()]

    async def cluster_arch_hint(self) -> str | None:
        """``amd64``/``arm64`` if every registered worker advertises one architecture attribute.

        0.2.20 protos have no architecture field; only a worker attribute (e.g. ``arch`` set through
        ``IRIS_WORKER_ATTRIBUTES``) can tell. None when unknowable (no workers, no attribute, mixed)."""
        archs = set()
        for worker in await self.workers():
            attrs = worker.metadata.attributes
            value = None
            for key in _ARCH_ATTRIBUTE_KEYS:
                if key in attrs and attrs[key].string_value:
                    value = _ARCH_ALIASES.get(attrs[key].string_value.lower())
                    break
            if value is None:
                return None
            archs.add(value)
        return archs.pop() if len(archs) == 1 else None
