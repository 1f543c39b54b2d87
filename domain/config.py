"""Service configuration: one TOML file plus environment variables.

Why a single model: the worker, the starter and the sandbox all read the same file, so a cluster,
registry or credential source is described once. Secrets are never stored here, only *where* to get
them at execution time (``CredentialSource``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from domain.credential_hosts import cleartext_problem, host_of
from domain.credential_hosts import is_loopback_host as is_loopback_host  # re-exported

CONFIG_ENV = "GPU_RL_BUILDER_CONFIG"


class ConfigError(ValueError):
    """Bad configuration: the message names the file and the field."""


class _Model(BaseModel):
    # allow_inf_nan=False: TOML's inf and nan are refused for every number ("Input should be a finite number").
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _durations(cls, value, info):
        """A duration (every ``*_s`` key) is finite and not negative; the error names the key."""
        if (info.field_name or "").endswith("_s") and isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"a duration in seconds must be finite and >= 0, got {value}")
        return value


class CredentialSource(_Model):
    """Where a secret comes from at execution time; never the secret itself."""

    # temporal_profile: the api_key of a Temporal client profile (read by runtime.temporal only)
    # token_owner (registry.user only): the GitHub login that owns registry.token, read with that token
    # from ``GET <registry.github_api_url>/user`` — never from another credential.
    kind: Literal["env", "file", "command", "literal_public", "temporal_profile", "token_owner"] = Field(
        description="Where the value is read: `env` (a variable), `file`, `command` (its stdout), `literal_public` "
                    "(a non-secret value written here), `temporal_profile` (the api_key of a Temporal client "
                    "profile), `token_owner` (registry.user only: the GitHub login owning registry.token).")
    name: str | None = Field(None, description="env: the variable's name; temporal_profile: the profile's name.")
    path: str | None = Field(None, description="file: a file holding the value; temporal_profile: its config file.")
    argv: list[str] | None = Field(None, description='command: the command to run, e.g. `["gh", "auth", "token"]`.')
    value: str | None = Field(None, description="literal_public: the value itself; non-secret values only (a user "
                                                "name).")

    def describe(self) -> str:
        """A safe description for plans and errors (never the value of a secret)."""
        match self.kind:
            case "env":
                return f"env:{self.name}"
            case "file":
                return f"file:{self.path}"
            case "command":
                # The executable's name and a fingerprint of the argv: an argument may itself be a
                # secret (``--token=…``), and this text reaches plans, history and errors.
                argv = self.argv or []
                exe = os.path.basename(argv[0]) if argv else "?"
                digest = hashlib.sha256("\0".join(argv).encode()).hexdigest()[:12]
                return f"command:{exe} (argv sha256:{digest})"
            case "temporal_profile":
                return f"temporal-profile:{self.name}" + (f"@{self.path}" if self.path else "")
            case "token_owner":
                return "token-owner:registry.token"
            case _:
                return f"literal:{self.value}"


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 literal) → (host, port); ValueError naming the value."""
    host, sep, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    bad = (not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/[] ")
           or (":" in host and not _is_ip(host)))
    if bad:
        raise ValueError(f"address {address[:80]!r}: expected HOST:PORT (e.g. temporal.example.org:7233, "
                         "[::1]:7233)")
    return host, int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class CodecKey(_Model):
    """One AES-GCM key of the payload codec (runtime/payload_codec.py): its id goes into each payload's
    metadata, so a rotated-out key still decrypts what it encrypted."""

    id: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="The key id written into each payload's "
                                                                     "metadata (letters, digits, . _ -).")
    key: CredentialSource = Field(description="The key: base64 of 16, 24 or 32 random bytes (env, file or command).")

    @model_validator(mode="after")
    def _secret_source(self) -> CodecKey:
        if self.key.kind in ("literal_public", "token_owner", "temporal_profile"):
            raise ValueError(f"key: kind {self.key.kind!r} cannot hold a key (use env, file or command)")
        return self


class CodecServerSettings(_Model):
    """``[temporal.codec.server]``: the codec server the Temporal UI calls (``/decode``, ``/encode``) to show
    payloads to operators (runtime/codec_server.py); served by the worker while it runs."""

    listen: str = Field("127.0.0.1:8092", description="HOST:PORT the codec server listens on.")
    cors_origins: list[str] = Field(default_factory=list, description="Origins allowed to call it from a browser "
                                                                      "(the Temporal UI's, e.g. "
                                                                      "https://temporal.example.org).")
    tokens: list[CredentialSource] = Field(default_factory=list, description="Bearer tokens that may decode "
                                                                             "(operators' tools; env, file or "
                                                                             "command).")
    github_operators: bool = Field(False, description="Also accept a GitHub access token (the one the UI passes "
                                                      "with codec.passAccessToken under GitHub sign-in) whose "
                                                      "login is an operator: in operators.logins or a member of "
                                                      "operators.teams (as approve-merge checks it).")
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0, description="Larger requests are refused (413).")

    @model_validator(mode="after")
    def _check(self) -> CodecServerSettings:
        split_address(self.listen)
        for i, t in enumerate(self.tokens):
            if t.kind in ("literal_public", "token_owner", "temporal_profile"):
                raise ValueError(f"tokens[{i}]: kind {t.kind!r} cannot hold a token (use env, file or command)")
        if not self.tokens and not self.github_operators:
            raise ValueError("nobody could decode: set tokens and/or github_operators = true")
        return self


class CodecSettings(_Model):
    """``[temporal.codec]``: every payload the worker and the starter send to Temporal is redacted, and
    with keys also encrypted (AES-GCM); the first key encrypts, every key decrypts. The environment variable
    ``GPU_RL_BUILDER_CODEC_KEYS`` (``id=base64key,id2=base64key``) replaces ``keys`` when set."""

    keys: list[CodecKey] = Field(default_factory=list, description="AES-GCM keys, the primary first; empty: "
                                                                   "payloads are redacted, not encrypted.")
    require_encryption: bool = Field(False, description="Refuse to start without a key (production).")
    server: CodecServerSettings | None = Field(None, description="The codec server for the Temporal UI.")

    @model_validator(mode="after")
    def _unique(self) -> CodecSettings:
        ids = [k.id for k in self.keys]
        if dup := sorted({i for i in ids if ids.count(i) > 1}):
            raise ValueError(f"keys: duplicate key id {', '.join(dup)}")
        return self


class TemporalSettings(_Model):
    """How to reach Temporal. ``runtime.temporal.resolve_config`` layers a Temporal client profile,
    TEMPORAL_* variables and command-line flags over these values; TLS material is named by path."""

    address: str = Field("localhost:7233", description="The Temporal frontend, HOST:PORT (TEMPORAL_ADDRESS, "
                                                       "--address override it).")
    namespace: str = Field("default", description="The Temporal namespace the builds run in.")
    task_queue: str = Field("gpu-rl-builder", description="The task queue workers poll and builds are started on.")
    ui_url: str | None = Field(None, description="The Temporal UI, e.g. http://127.0.0.1:8233; used for links in "
                                                 "reports and PRs.")
    profile: str | None = Field(None, description="A profile of the Temporal client config file "
                                                  "(temporalio.envconfig) layered under these values.")
    api_key: CredentialSource | None = Field(None, description="The API key (Temporal Cloud), read at connect "
                                                               "time; a credential source.")
    tls: bool = Field(False, description="Connect with TLS (implied by any tls_* path or server name).")
    tls_server_ca_cert_path: str | None = Field(None, description="The private CA of a team server (PEM path).")
    tls_client_cert_path: str | None = Field(None, description="mTLS client certificate (PEM path; Temporal Cloud "
                                                               "certificates, team server); with tls_client_key_path.")
    tls_client_key_path: str | None = Field(None, description="mTLS client key (PEM path); with "
                                                              "tls_client_cert_path.")
    tls_server_name: str | None = Field(None, description="SNI / certificate name override.")
    codec: CodecSettings = Field(CodecSettings(), description="The payload codec: redaction, encryption, the "
                                                              "codec server (runtime/payload_codec.py).")

    @model_validator(mode="after")
    def _address(self) -> TemporalSettings:
        split_address(self.address)  # HOST:PORT, refused here (config, profile, TEMPORAL_ADDRESS, --address)
        return self

    def uses_tls(self) -> bool:
        return bool(self.tls or self.tls_client_cert_path or self.tls_server_ca_cert_path or self.tls_server_name)

    @model_validator(mode="after")
    def _mtls_pair(self) -> TemporalSettings:
        if bool(self.tls_client_cert_path) != bool(self.tls_client_key_path):
            raise ValueError("tls_client_cert_path and tls_client_key_path must be set together (mTLS pair)")
        return self


class PortForward(_Model):
    """A ``kubectl port-forward`` to the controller's Service, opened by the client itself."""

    namespace: str = Field("iris", description="Kubernetes namespace of the controller's Service.")
    service: str = Field("iris-controller-svc", description="The controller's Service name.")
    port: int = Field(10000, description="The Service port the controller listens on.")


class ClusterSettings(_Model):
    """How to reach one Iris cluster's controller."""

    controller_url: str | None = Field(None, description="The controller's URL, reached directly; or "
                                                         "port_forward.")
    port_forward: PortForward | None = Field(None, description="A kubectl port-forward the client opens itself "
                                                               "(instead of controller_url).")
    kubeconfig: str | None = Field(None, description="kubeconfig for the port-forward, pod termination reasons "
                                                     "and events.")
    kube_context: str | None = Field(None, description="The kubeconfig context of this cluster.")
    kubectl: str = Field("kubectl", description="The kubectl binary (port-forward, pod termination reasons, "
                                                "events).")
    # Override only (YYYY-MM-DD). Unset: the build date of the marin-iris the client was tested against
    # (clients/iris_pin.py), which moves with an upgrade instead of expiring here.
    client_revision_date: str | None = Field(None, description="Override only (YYYY-MM-DD); unset, the client "
                                                               "sends the build date of the marin-iris it was "
                                                               "tested against (clients/iris_pin.py).")
    iris_user: str = Field("gpu-rl-builder", description="The Iris user the jobs are submitted as (the first "
                                                         "part of their wire name, /<iris_user>/<job>).")
    # A bearer token for controllers that require one (a non-empty trusted_cidrs off-cluster). Read at
    # request time from its source, never persisted. Without it the request is anonymous; note that a
    # controller treats a tokenless request from loopback (kubectl port-forward) as an admin.
    token: CredentialSource | None = Field(None, description="A bearer token for a controller that requires one "
                                                             "(off-cluster), read at request time; unset: "
                                                             "anonymous.")
    job_env: dict[str, str] = Field(default_factory=dict, description="Extra non-secret environment for every "
                                                                      "job on this cluster.")
    architecture: str | None = Field(None, description="The host architecture (amd64, arm64), declared when the "
                                                       "controller cannot tell.")
    image_check_runner: list[str] = Field(default_factory=list, description="Argv put before `bash -c <checks>` "
                                          "of the job that runs a built image's own checks (its task image is that "
                                          "image). Empty on a real cluster; a controller whose tasks run on the "
                                          "host (the sandbox) names the program that lays the image out first "
                                          "(sandbox/image_run_standin.py).")

    @field_validator("client_revision_date")
    @classmethod
    def _iso_date(cls, v: str | None) -> str | None:
        import datetime

        if v is not None:
            try:
                datetime.date.fromisoformat(v)
            except ValueError:
                raise ValueError(f"must be a date YYYY-MM-DD, got {v!r}") from None
        return v


def safe_name(text: str) -> str:
    """``text`` as a file or branch name component (what a workflow id becomes in paths and branches)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:120]


class RepoSettings(_Model):
    """The repositories a build reads and writes."""

    marinskyrl_url: str = Field(description="Clone URL of MarinSkyRL (the source built, where the pin commit and "
                                            "PR go).")
    harbor_url: str = Field(description="Clone URL of Harbor (the commit baked into every Dockerfile).")
    marinskyrl_slug: str = Field("marin-community/MarinSkyRL", description="MarinSkyRL's owner/name on GitHub "
                                                                           "(PRs, checks).")
    harbor_slug: str = Field("marin-community/harbor", description="Harbor's owner/name on GitHub.")
    build_branch_prefix: str = Field("gpu-rl-build/", description="Prefix of the branch each build's pin commit "
                                                                  "and PR live on.")
    git_author_name: str = Field("gpu-rl-builder", description="Author name of the build and pin commits.")
    git_author_email: str = Field("gpu-rl-builder@users.noreply.github.com",
                                  description="Author email of the build and pin commits.")

    def build_branch(self, request_id: str) -> str:
        """The branch a build's pin commit and PR live on: one per pipeline workflow id, so a GitHub event
        naming the branch names the build (the webhook receiver's mapping; no second record of it)."""
        return f"{self.build_branch_prefix}{safe_name(request_id)}"


class RegistrySettings(_Model):
    # Required: where images go, and the one host the registry credential is ever sent to (the build
    # script's default repository is repository content and never decides where the token goes).
    image_repository: str = Field(description="Where images go, and the one host the registry credential is "
                                              "ever sent to.")
    insecure_hosts: list[str] = Field(default_factory=list, description=(
        "Registry hosts reached over plain http: loopback only (127.0.0.1, ::1, localhost) when a registry "
        "credential goes there; any other host is refused at load, naming this key."))
    # The registry user: an explicit value (literal_public/env/file), or ``{kind = "token_owner"}`` for
    # the GitHub login that owns registry.token (ghcr.io), read with registry.token itself.
    user: CredentialSource = Field(description='The registry user: an explicit value (literal_public, env, file) '
                                               'or `{kind = "token_owner"}` (the login owning registry.token).')
    token: CredentialSource = Field(description="The registry token (push, and the kaniko job's credential).")
    github_api_url: str | None = Field(None, description="Where token_owner asks `GET /user` (default: "
                                                         "github.api_url).")
    token_realm_hosts: list[str] = Field(default_factory=list, description=(
        "Hosts besides the registry's own that may receive registry.user/registry.token when the registry's "
        "WWW-Authenticate challenge names them as its token realm (e.g. auth.docker.io for Docker Hub). The "
        "registry's own host (any port) is always allowed; a realm elsewhere gets an anonymous token request."))


class GitHubAppSettings(_Model):
    """A GitHub App installation: its id, the installation and the App's private key (a PEM file).

    The worker mints a short-lived installation token from these (clients/github_app.py); only the key
    is a long-lived secret."""

    app_id: str = Field(description="The App's numeric id (or client id): the JWT issuer.")
    installation_id: int = Field(description="The App's installation on the MarinSkyRL repository.")
    private_key: CredentialSource = Field(description="The App's private key (PEM), a credential source.")


class GitHubWebhookSettings(_Model):
    """``[github.webhook]``: a receiver for GitHub's webhooks (runtime/webhooks.py), for a worker GitHub can
    reach. A check, status, review or PR event wakes the build's merge wait to read GitHub at once; the
    poll stays the fallback. Off unless configured."""

    listen: str = Field("0.0.0.0:8090", description="HOST:PORT the worker listens on (behind a Service or "
                                                    "ingress).")
    path: str = Field("/github/webhook", description="The Payload URL's path.")
    # The webhook's secret (GitHub signs each body with it: X-Hub-Signature-256); read at start, never logged.
    secret: CredentialSource = Field(description="The webhook's secret (GitHub signs each body with it); env, "
                                                 "file or command, read at start, never logged.")
    max_body_bytes: int = Field(default=2 * 1024 * 1024, gt=0, description="Larger bodies are refused (413) "
                                                                            "unread.")
    idle_timeout_s: float = Field(default=10.0, gt=0, description=(
        "A keep-alive connection idle for this long is closed."))
    read_timeout_s: float = Field(default=30.0, gt=0, description=(
        "A request's line and headers, then its body, must each arrive within this long, or the connection "
        "is closed (a client trickling bytes holds a socket for at most this long; never a thread)."))
    max_connections: int = Field(default=32, gt=0, description=(
        "Deliveries handled at once; one more is answered 503 (GitHub redelivers). Open connections are "
        "sockets of an asyncio server (uvicorn), not threads."))

    @model_validator(mode="after")
    def _listen(self) -> GitHubWebhookSettings:
        split_address(self.listen)
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {self.path!r}")
        if self.secret.kind in ("literal_public", "token_owner", "temporal_profile"):
            raise ValueError(f"secret: kind {self.secret.kind!r} cannot hold a webhook secret (use env, file or command)")
        return self


class GitHubSettings(_Model):
    """GitHub: the PR with the pin table, issue comments, required checks and the merge."""

    api_url: str = Field("https://api.github.com", description="The GitHub REST API (GitHub Enterprise: "
                                                               "https://<host>/api/v3).")
    web_url: str | None = Field(None, description=(
        "The host issue and PR links are on (`--issue-url` must be there) and git's host: the only "
        "scheme://host[:port] git's credential (token, or app's installation tokens) is given to, over https "
        "(deploy/README.md, git's credential); default: api_url's host without `api.`."))
    token: CredentialSource | None = Field(None, description="A personal access token (classic or fine-grained), "
                                                             "also git's credential for fetch and push; exactly "
                                                             "one of token and app.")
    app: GitHubAppSettings | None = Field(None, description="A GitHub App installation (short-lived tokens, also "
                                                            "git's credential); exactly one of token and app.")
    pin_table_path: str = Field("cloud/iris/gpu_rl_images.py", description="The file whose pin table the PR "
                                                                           "updates with the validated digests.")
    do_not_touch: list[str] = Field(default_factory=lambda: ["cloud/iris/launch_rl_iris.py"],
                                    description="Paths a build commit must never change (refused if it would).")
    lint_command: list[str] | None = Field(None, description="Run on the pin commit before it is pushed, e.g. "
                                                             "the repository's pre-commit.")
    tracking_issue_url: str = Field("https://github.com/marin-community/marin/issues/7920",
                                    description="Named in the PR body: the issue tracking the legacy "
                                                "image path's removal.")
    # The merge gate waits on the base branch's required checks as GitHub states them (branch protection
    # and rulesets). These are used instead, and the report says so, when GitHub cannot tell (the token
    # may not read branch protection: 403) or states none; with neither, every reported check is required.
    required_checks: list[str] = Field(default_factory=list, description="Required checks used when GitHub "
                                                                         "cannot tell (403) or states none; with "
                                                                         "neither, every reported check is "
                                                                         "required.")
    webhook: GitHubWebhookSettings | None = Field(None, description="A webhook receiver that wakes the merge "
                                                                    "wait; off by default (the PR watch polls).")

    @model_validator(mode="after")
    def _one_identity(self) -> GitHubSettings:
        if (self.token is None) == (self.app is None):
            raise ValueError("set exactly one of github.token (a token) and github.app (an App installation)")
        return self


class OperatorSettings(_Model):
    """Who may authorize a merge (``approve-merge``, an ``/approve-merge`` comment or an approving review)
    and answer a waiting target (``decide``): GitHub logins and/or teams (``org/team-slug``, membership
    read through the GitHub API). Checked by the worker, never taken from the caller: empty = nobody."""

    logins: list[str] = Field(default_factory=list, description="GitHub logins allowed to authorize a merge and "
                                                                "decide (case-insensitive).")
    teams: list[str] = Field(default_factory=list, description="GitHub teams (`org/team-slug`) whose members may; "
                                                               "membership read through the GitHub API.")

    @field_validator("logins")
    @classmethod
    def _logins(cls, logins: list[str]) -> list[str]:
        if empty := [i for i, x in enumerate(logins) if not x.strip()]:
            raise ValueError(f"entry {empty[0]} is an empty login (a GitHub login is required)")
        return logins

    @model_validator(mode="after")
    def _team_form(self) -> OperatorSettings:
        bad = [t for t in self.teams if t.count("/") != 1 or not all(t.split("/"))]
        if bad:
            raise ValueError(f"teams must be 'org/team-slug', got {', '.join(map(repr, bad))}")
        return self

    def lists(self, login: str) -> bool:
        """``login`` is listed by name (GitHub logins are case-insensitive)."""
        return login.strip().lower() in {x.strip().lower() for x in self.logins}


class PolicySettings(_Model):
    """Retry budgets per failure class and timers; the class names are domain.failures classes."""

    retry_budget: dict[str, int] = Field(
        default_factory=lambda: {"preemption": 3, "worker_loss": 2, "registry_transient": 2},
        description="Automatic resubmissions per failure class (domain/failures.py); a class not listed is "
                    "not retried automatically.")
    allow_adopted_image: bool = Field(False, description="Whether a succeeded job whose log does not show its own "
                                      "push may pass with the image that was already at the tag before the job "
                                      "was submitted (reported as adopted, not built by this job). Off: such a "
                                      "target ends log_lost, naming the digest it found.")
    image_check_timeout_s: int = Field(420, ge=30, description="How long the job that runs a built image's own "
                                       "checks (where a lost log cannot prove a marker) may take, pulling the "
                                       "image included, before the marker stays unproven (log_lost).")
    operator_decision_timeout_s: int = Field(24 * 3600, description="How long a target waits for `decide` before "
                                                                    "it fails.")
    visibility_recheck_interval_s: int = Field(600, description="A waiting target validates again this often "
                                                                "without `recheck`.")
    # An inconclusive validation (registry 5xx/429, network) is validated again with backoff for this
    # long before the target fails naming the inconclusive checks; only a ``fail`` verdict fails at once.
    validation_inconclusive_budget_s: int = Field(default=1800, ge=0, description="How long an inconclusive "
                                                  "validation (registry 5xx/429, network) is repeated before it "
                                                  "becomes a registry_unreachable wait.")
    validation_retry_initial_s: float = Field(default=10.0, gt=0, description="First delay between inconclusive "
                                                                              "validations (doubling).")
    validation_retry_max_s: float = Field(default=120.0, gt=0, description="Longest delay between inconclusive "
                                                                           "validations.")
    poll_min_interval_s: float = Field(2.0, description="Legacy monitor_job: shortest poll of a job's state "
                                                        "(runs started before the watcher).")
    poll_max_interval_s: float = Field(30.0, description="Legacy monitor_job: longest poll (backs off while "
                                                         "nothing changes).")
    progress_interval_s: float = Field(50.0, description="Legacy per-target monitor_job heartbeat (workflows "
                                                         "started before the watcher).")
    # The per-cluster watcher (activities/watch.py): one GetJobState per interval for every running job.
    # ``watch_status_budget_per_min`` is a hard cap: at most that many status requests (GetJobState, every
    # ListJobs page, GetJobStatus) of a cluster in any sliding minute, enforced by the poller itself. The
    # regular cadence spends it on evenly spaced polls (5 s at 12; ``watch_interval_s`` is its ceiling);
    # ``watch_fast_interval_s`` (while a job is followed or near its end, and for a minute after an end while
    # others run) is taken only where the window has slots the regular polls do not need (after a quiet
    # stretch), never above the cap. To poll less, lower ``watch_status_budget_per_min``.
    watch_interval_s: float = Field(default=6.0, gt=0, description="The longest interval between the watcher's "
                                                                   "status polls while jobs run (per cluster); "
                                                                   "the budget's own (5 s) when shorter.")
    watch_fast_interval_s: float = Field(default=3.0, gt=0, description="The cadence while a job is followed or "
                                                                        "near its end, where the budget's window "
                                                                        "has room.")
    watch_idle_interval_s: float = Field(default=15.0, gt=0, description="Not used since queued jobs are polled at "
                                                                        "the running cadence (a start is seen at the "
                                                                        "next poll); kept so configurations that set "
                                                                        "it still load.")
    watch_status_budget_per_min: float = Field(default=12.0, gt=0, description="Status requests per cluster in "
                                                                               "any sliding minute at most "
                                                                               "(ListJobs pages included); a "
                                                                               "hard cap on every cadence.")
    watch_status_burst: float = Field(default=36.0, ge=1, description="Not used since the budget is a hard cap "
                                                                      "per sliding minute (a bank let bursts "
                                                                      "exceed it); kept so configurations that "
                                                                      "set it still load.")
    watch_progress_interval_s: float = Field(60.0, description="Pending reasons and preemptions (ListJobs) this "
                                                               "often.")
    # One FetchLogs per cluster (prefix of every running job, from the global log cursor) this often.
    watch_log_interval_s: float = Field(default=30.0, gt=0, description="One log request per cluster (every "
                                                                        "running job's markers) this often.")
    watch_follow_interval_s: float = Field(10.0, description="The log cadence while someone follows a job.")
    # The controller's audit feed (activities/watch.py, domain/controller_feed.py): its `job_terminated` lines are
    # read beside the polls (log requests, not status requests) and bring a watched job's next status read
    # forward; the verdict is always the status read's. While the feed is trusted and every watched job has
    # started, the regular polls are a backstop.
    watch_feed: bool = Field(True, description="Read the controller's audit feed (`/system/controller`) to see job "
                                               "ends within seconds; false: status polls only (5 s at 12 a minute).")
    watch_feed_interval_s: float = Field(default=1.0, gt=0, description="One audit feed read per cluster this often "
                                                                        "while jobs are watched.")
    watch_feed_backstop_s: float = Field(default=15.0, gt=0, description="The regular status poll's interval while "
                                                                         "the feed is trusted and every watched "
                                                                         "job has started.")
    watch_feed_confirm_s: float = Field(default=10.0, gt=0, description="An end a poll found that the feed has "
                                                                        "not named within this long is a miss: the "
                                                                        "feed is distrusted for "
                                                                        "watch_feed_penalty_s.")
    watch_feed_penalty_s: float = Field(default=300.0, ge=0, description="How long a feed that missed an end is "
                                                                         "not trusted (the regular cadence).")
    watch_feed_retry_max_s: float = Field(default=30.0, gt=0, description="A failing feed read is tried again "
                                                                          "after 1, 2, 4 ... s, at most this long.")
    watch_signal_progress_s: float = Field(900.0, description="Progress-only wake-ups of a target (history "
                                                              "events) at most this often.")
    monitor_safety_interval_s: float = Field(1200.0, description="A target re-checks its watch when not woken "
                                                                 "for this long.")
    # Planning asks each cluster the plan uses for its live architecture at most this long (all at once).
    plan_cluster_deadline_s: float = Field(default=1.5, gt=0, description="Planning asks each cluster for its "
                                                                          "live architecture at most this long.")

    # The PR watch polls GitHub this often (about 5 requests a poll), and faster while an accepted merge
    # authorization waits for the required checks to turn green (the critical path of approve-at-green).
    merge_watch_interval_s: float = Field(default=5.0, gt=0, description="The PR watch polls GitHub this often.")
    merge_watch_authorized_interval_s: float = Field(default=2.0, gt=0, description="The same once a merge is "
                                                                                    "authorized and waits for "
                                                                                    "green checks.")
    merge_watch_registry_interval_s: float = Field(
        default=60.0, gt=0, description="While a PR waits for its merge, every pinned tag is checked this often "
                                        "(still at the validated digest, still anonymously pullable): a tag moved "
                                        "or deleted, or a package made private, by someone else holds the merge.")

    # The rehearsal (rehearsal/runner.py) runs every planned command in the task image's userland under
    # bwrap before anything is submitted. A worker that cannot isolate (no user namespaces) or cannot
    # pull the task image cannot rehearse: "required" refuses the plan saying what is missing,
    # "best_effort" plans on with "rehearsal skipped: <reason>".
    rehearsal: Literal["required", "best_effort"] = Field(
        "required", description="`required`: a worker that cannot rehearse (no isolation, task image not "
                                "pullable) refuses the plan naming what it lacks; `best_effort`: the plan says "
                                "\"rehearsal skipped: <reason>\" and goes on.")
    rehearsal_isolation: Literal["auto", "bwrap", "proot"] = Field(
        "auto", description="How the rehearsal isolates: `bwrap` (user, mount, PID and network namespaces; needs "
                            "seccomp/AppArmor that allow them), `proot` (ptrace path translation under Landlock "
                            "and seccomp: runs under Pod Security baseline and restricted; Linux >= 6.12), "
                            "`auto` bwrap where it runs, else proot.")
    rehearsal_emulators: dict[str, str] = Field(
        default_factory=lambda: {"arm64": "qemu-aarch64-static", "amd64": "qemu-x86_64-static"},
        description="Architecture -> user-mode emulator (a program on PATH or an absolute path; Debian package "
                    "qemu-user-static) that runs a target of another architecture than the worker's in that "
                    "architecture's userland, under proot (rehearsal/emulation.py). Missing or \"\": the worker's "
                    "own variant, and a step that concerns the target's architecture is unrehearsed.")
    rehearsal_image_cache_dir: str | None = Field(
        None, description="Where task images are kept unpacked by manifest digest for the rehearsal (a second "
                          "rehearsal downloads nothing); default `<work_dir>/rehearsal-images`.")
    rehearsal_registry_mirrors: dict[str, str] = Field(
        default_factory=dict, description="Registry -> mirror `host[:port]` asked instead of that registry, as "
                                          "containerd and Docker ask a pull-through cache (e.g. `docker.io = "
                                          "\"mirror.example:5000\"`): for the rehearsal's task image and for the "
                                          "look-up before submission of every image the build pulls (each FROM "
                                          "base, `COPY --from` image and crane read, for the target's platform). "
                                          "Plain http when the mirror is in registry.insecure_hosts; asked "
                                          "anonymously (the job's credentials go only to registry.image_repository's "
                                          "own host).")

    @model_validator(mode="after")
    def _watch_cadence_order(self) -> PolicySettings:
        if not self.watch_fast_interval_s <= self.watch_interval_s <= self.watch_idle_interval_s:
            raise ValueError(
                "watch intervals must satisfy watch_fast_interval_s <= watch_interval_s <= watch_idle_interval_s, "
                f"got {self.watch_fast_interval_s:g}, {self.watch_interval_s:g}, {self.watch_idle_interval_s:g}")
        return self


class EvidenceSettings(_Model):
    """Where failure logs and diagnostics are kept so they outlive the worker (an fsspec URL).

    Default: ``<work_dir>/evidence`` on the worker's disk (sandbox). Production: an object store such as
    ``s3://bucket/gpu-rl-builder/evidence`` (needs ``s3fs``; credentials from the environment/IAM, never here)."""

    url: str | None = Field(None, description="An fsspec URL (s3://… needs the `s3` extra); default: "
                                              "`<work_dir>/evidence`.")
    storage_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="fsspec options, non-secret only (e.g. endpoint_url); credentials come "
                                          "from the environment/IAM.")


class ArchBuildSettings(_Model):
    """How one architecture's build job is launched when the ops doc does not say (it wins when it does)."""

    cluster: str = Field(description="The configured cluster (`[clusters.<name>]`) that builds this "
                                     "architecture.")
    priority: str = Field("interactive", description="Iris priority band (production, interactive, batch).")
    cpu: float = Field(description="CPUs of the build job.")
    memory: str = Field(description='Memory of the build job, in Iris CLI units ("512GB").')
    disk: str = Field(description='Disk of the build job ("400GB").')
    gpu: str | None = Field(None, description='GPU request, e.g. "GB200x1" (on arm64 it forces a Grace host).')
    max_retries: int = Field(0, description="Iris-level task retries of the build job.")
    timeout_s: int = Field(description="The build job's per-task timeout.")


class BoundaryRuleSettings(_Model):
    """One rule of the rebuild boundary: does a change under ``glob`` need a new image."""

    glob: str = Field(description="Paths (glob) of the MarinSkyRL repository this rule covers.")
    rebuild: bool = Field(description="Whether a change there needs a new image.")
    reaches: str = Field("", description="What the change reaches (shown as the reason).")


def _default_architectures() -> dict[str, ArchBuildSettings]:
    # The shapes the ops doc documented when this was written (runbook.md); kept in sync by review.
    return {
        "amd64": ArchBuildSettings(cluster="cw-rno2a", cpu=48, memory="512GB", disk="400GB", max_retries=0,
                                   timeout_s=18000),
        "arm64": ArchBuildSettings(cluster="cw-us-east-08a", gpu="GB200x1", cpu=96, memory="640GB",
                                   disk="500GB", max_retries=3, timeout_s=28800),
    }


def _default_boundary() -> list[BoundaryRuleSettings]:
    return [
        BoundaryRuleSettings(glob="skyrl-train/**", rebuild=True, reaches="baked into the image"),
        BoundaryRuleSettings(glob="docker/**", rebuild=True, reaches="Dockerfiles and the build script"),
        BoundaryRuleSettings(glob="uv.lock", rebuild=True, reaches="frozen environment"),
        BoundaryRuleSettings(glob="pyproject.toml", rebuild=True, reaches="dependency closure"),
        BoundaryRuleSettings(glob="cloud/iris/**", rebuild=False, reaches="/app workspace bundle, no rebuild"),
        BoundaryRuleSettings(glob=".agents/**", rebuild=False, reaches="documentation only"),
    ]


class BuildSettings(_Model):
    """Fallbacks for every planned value the ops doc can state (``[build]``).

    Why: the ops doc is prose and changes shape between revisions; a section it drops or rewords
    must never stop a build, so each field it would give has a configured value here. The plan says
    which one was used (``config:build.<key>``) and reports where prose and configuration differ.
    """

    task_image: str = Field("docker.io/library/ubuntu:22.04", description="The Iris task image the build script "
                                                                        "runs in.")
    no_sync: bool = Field(True, description="Submit with --no-sync (the Ubuntu task image has no uv).")
    enable_extra_resources: bool = Field(True, description="Submit with --enable-extra-resources.")
    job_name: str = Field("gpurl-kaniko-${ARCH}-${VARIANT}-${SHORT_SHA}", description="The Iris job name "
                                                                                    "template.")
    script_env_var: str = Field("BUILD_B64", description="The variable carrying the build script (base64) into "
                                                         "the job.")
    command: list[str] = Field(default_factory=lambda: [
        "bash", "-lc", 'f=$(mktemp) && echo "$BUILD_B64" | base64 -d > "$f" && exec bash "$f"'],
        description="The job's command (decodes and runs the script).")
    megatron_env: dict[str, str] = Field(
        default_factory=lambda: {"INSTALL_MEGATRON": "1", "TAG_PREFIX": "gpu-rl-megatron"},
        description="Extra job environment of the megatron variant.")
    max_layer_bytes: int = Field(8 * 10**9, description='Validation fails a layer above this ("approximately '
                                                        '8 GB").')
    warn_layer_bytes: int = Field(4 * 10**9, description="Validation warns about a layer above this.")
    min_layers: int = Field(20, description="Validation fails an image with fewer layers.")
    architectures: dict[str, ArchBuildSettings] = Field(default_factory=_default_architectures,
                                                        description="Job shape per architecture (`[build."
                                                                    "architectures.<arch>]`).")
    deploy_boundary: list[BoundaryRuleSettings] = Field(default_factory=_default_boundary,
                                                        description="The rebuild boundary of scheduled checks, "
                                                                    "first matching rule wins.")


class ServiceConfig(_Model):
    work_dir: str = Field(description="Worktrees, bundles and mirrors (scratch: may be lost with the worker).")
    temporal: TemporalSettings = Field(TemporalSettings(), description="How to reach Temporal.")
    repos: RepoSettings = Field(description="The repositories a build reads and writes.")
    clusters: dict[str, ClusterSettings] = Field(description="The Iris clusters, by name (`[clusters.<name>]`).")
    registry: RegistrySettings = Field(description="The image registry.")
    github: GitHubSettings | None = Field(None, description="GitHub: the PR with the pin table, issue comments, "
                                                            "required checks, the merge.")
    operators: OperatorSettings = Field(OperatorSettings(), description="Who may authorize a merge and decide.")
    policy: PolicySettings = Field(PolicySettings(), description="Retry budgets and timers.")
    evidence: EvidenceSettings = Field(EvidenceSettings(), description="Where logs and diagnostics are kept.")
    build: BuildSettings = Field(BuildSettings(), description="Fallbacks for what the ops doc does not state.")

    def rehearsal_image_cache(self) -> Path:
        """Where the rehearsal keeps unpacked task images (``policy.rehearsal_image_cache_dir``)."""
        return Path(self.policy.rehearsal_image_cache_dir or Path(self.work_dir) / "rehearsal-images").expanduser()

    def evidence_url(self) -> str:
        """The evidence store's root URL (``[evidence] url``, else ``<work_dir>/evidence``)."""
        return self.evidence.url or str(Path(self.work_dir).expanduser() / "evidence")

    @model_validator(mode="after")
    def _identities(self) -> ServiceConfig:
        """Each identity from its own credential: ``token_owner`` only names the registry user, and with
        a GitHub App (no user behind its tokens) the registry user is configured explicitly."""
        for key, source in self._sources().items():
            if source.kind == "token_owner" and key != "registry.user":
                raise ValueError(f"{key}: kind 'token_owner' only applies to registry.user")
            if source.kind == "literal_public" and key != "registry.user":
                raise ValueError(f"{key}: kind 'literal_public' is for a value that is not secret (registry.user); "
                                 "a secret is read from env, file or command, never written in the file")
        user = self.registry.user
        if self.github is not None and self.github.app is not None and user.kind in ("command", "token_owner"):
            raise ValueError(
                f"registry.user: with github.app (installation tokens, which have no user) configure the registry "
                f"user explicitly ({{kind = \"literal_public\", value = \"<login>\"}}, env or file), not "
                f"{user.describe()}")
        return self

    @model_validator(mode="after")
    def _credentials_over_tls(self) -> ServiceConfig:
        """No credential goes over plain http to a host that is not loopback (the worker and the starter
        both refuse such a file at load, naming the key). temporal.api_key is checked after profiles and
        TEMPORAL_* are layered (runtime.temporal.check_transport)."""
        for key, url, credential in self.credential_destinations():
            if problem := cleartext_problem(url, credential=credential):
                raise ValueError(f"{key} = {url[:120]!r}: {problem}")
        return self

    def credential_destinations(self) -> list[tuple[str, str, str]]:
        """Every configured address a credential is sent to: (its config key, the URL, what goes there)."""
        out: list[tuple[str, str, str]] = []
        gh = self.github
        if gh is not None:
            what = "github.token" if gh.token else "github.app.private_key (its JWT) and installation tokens"
            out.append(("github.api_url", gh.api_url, what))
        if self.registry.user.kind == "token_owner":
            key = "registry.github_api_url" if self.registry.github_api_url else "github.api_url"
            out.append((key, self.registry_user_api_url(), "registry.token (GET /user for registry.user)"))
        host = self.registry.image_repository.partition("/")[0]
        if host in self.registry.insecure_hosts:
            out.append(("registry.insecure_hosts", f"http://{host}", "registry.user and registry.token"))
        for name, c in sorted(self.clusters.items()):
            if c.controller_url:
                what = f"clusters.{name}.token and the job's secrets (LaunchJob environment)" if c.token else \
                    "the job's secrets (LaunchJob environment: registry.token)"
                out.append((f"clusters.{name}.controller_url", c.controller_url, what))
        out.append(("repos.marinskyrl_url", self.repos.marinskyrl_url, "the git push credentials"))
        if "@" in self.repos.harbor_url.partition("://")[2].partition("/")[0]:
            out.append(("repos.harbor_url", self.repos.harbor_url, "the credentials in the URL"))
        endpoint = self.evidence.storage_options.get("endpoint_url")
        if isinstance(endpoint, str):
            out.append(("evidence.storage_options.endpoint_url", endpoint, "the evidence store's credentials"))
        if self.evidence.url and self.evidence.url.lower().startswith(("http://", "https://")):
            out.append(("evidence.url", self.evidence.url, "the evidence store's credentials and the evidence"))
        return out

    def credential_hosts(self, key: str) -> tuple[str, ...]:
        """The hosts the credential at config key ``key`` may be sent to (request-time rule of
        clients/http_guard.py and the git push): its own configured host(s), nothing else."""
        if key in ("github.token", "github.app.private_key") and self.github is not None:
            from domain.issue_ref import github_web_host

            # The API host, and the web host git pushes to (github.web_url, else api_url's without "api.").
            web = host_of(self.github.web_url or f"https://{github_web_host(self.github.api_url)}")
            return tuple(dict.fromkeys(h for h in (host_of(self.github.api_url), web) if h))
        if key in ("registry.token", "registry.user"):
            hosts = [host_of("https://" + self.registry.image_repository.partition("/")[0]),
                     *self.registry.token_realm_hosts]
            if self.registry.user.kind == "token_owner":
                hosts.append(host_of(self.registry_user_api_url()))
            return tuple(h for h in hosts if h)
        if key.startswith("clusters.") and key.endswith(".token"):
            c = self.clusters.get(key.removeprefix("clusters.").removesuffix(".token"))
            return (host_of(c.controller_url),) if c and c.controller_url else ("127.0.0.1", "localhost")
        return ()

    def _sources(self) -> dict[str, CredentialSource]:
        gh = self.github
        sources = {"registry.user": self.registry.user, "registry.token": self.registry.token,
                   "github.token": gh and gh.token, "github.app.private_key": gh and gh.app and gh.app.private_key,
                   "github.webhook.secret": gh and gh.webhook and gh.webhook.secret,
                   "temporal.api_key": self.temporal.api_key}
        sources |= {f"clusters.{name}.token": c.token for name, c in sorted(self.clusters.items())}
        return {key: source for key, source in sources.items() if source}

    def credential_sources(self) -> dict[str, CredentialSource]:
        """Every configured credential by its configuration key (where each value is read, never the value).

        A ``token_owner`` registry user is derived from registry.token (clients/identity.py), not read."""
        return {key: s for key, s in self._sources().items() if s.kind != "token_owner"}

    def registry_user_api_url(self) -> str:
        """Where a ``token_owner`` registry user is looked up (``GET <url>/user`` with registry.token)."""
        return (self.registry.github_api_url or (self.github.api_url if self.github else None)
                or "https://api.github.com").rstrip("/")

    def required_tools(self) -> dict[str, str]:
        """Every executable the worker runs, each with the configuration key that asks for it.

        The worker checks them at start (and the image build against the example configuration), so
        a missing ``uv`` or ``gh`` stops it at once instead of retrying a recording activity forever.
        """
        tools = {"git": "repos (source, build commit and PR branch)"}
        for key, source in self.credential_sources().items():
            if source.kind == "command" and source.argv:
                tools.setdefault(source.argv[0], f"config:{key}")
        if self.github and self.github.lint_command:
            tools.setdefault(self.github.lint_command[0], "config:github.lint_command")
        for name, c in sorted(self.clusters.items()):
            if c.port_forward or c.kubeconfig or c.kube_context:
                tools.setdefault(c.kubectl, f"config:clusters.{name}.kubectl")
        return tools

    def cluster(self, name: str) -> ClusterSettings:
        try:
            return self.clusters[name]
        except KeyError:
            known = ", ".join(sorted(self.clusters)) or "none"
            raise ConfigError(f"cluster {name!r} is not configured (clusters: {known})") from None


def load_config(path: str | os.PathLike[str] | None = None) -> ServiceConfig:
    """Load the file named by ``path`` or ``$GPU_RL_BUILDER_CONFIG``.

    The Temporal connection is completed by ``runtime.temporal.resolve_config`` (profiles, TEMPORAL_*
    variables, flags), so every entry point layers them the same way.
    """
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"no configuration file: pass --config or set {CONFIG_ENV}")
    p = Path(path).expanduser()
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: configuration file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a configuration file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); save the configuration as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the configuration file: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: not a TOML table")
    try:
        return ServiceConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{p}: {'; '.join(config_error_lines(e))}") from None


# pydantic's wording before a validator's own message ("Value error, ..."): the key and the message say it all.
_PYDANTIC_PREFIX = re.compile(r"^(Value error|Assertion failed), ")


def config_error_lines(e: ValidationError) -> list[str]:
    """One ``key: message`` per problem, without pydantic's ``Value error, `` prefix. A file-wide check (no
    location) names its key(s) at the start of its own message, so no line starts with an empty key."""
    out = []
    for err in e.errors(include_input=False):
        key = ".".join(str(x) for x in err["loc"])
        msg = _PYDANTIC_PREFIX.sub("", err["msg"])
        out.append(f"{key}: {msg}" if key else msg)
    return out
