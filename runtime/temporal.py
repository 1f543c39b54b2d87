"""Connect to Temporal the same way from the worker, the starter and the tests.

Why ``temporalio.envconfig``: it is the SDK's own reader of Temporal client profiles (the TOML file
the ``temporal`` CLI writes, ``$TEMPORAL_CONFIG_FILE`` or ``~/.config/temporalio/temporal.toml``) and
of the ``TEMPORAL_*`` variables (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``,
``TEMPORAL_TLS``, ``TEMPORAL_TLS_CLIENT_CERT_PATH``, ``TEMPORAL_TLS_CLIENT_KEY_PATH``,
``TEMPORAL_TLS_SERVER_CA_CERT_PATH``, ``TEMPORAL_TLS_SERVER_NAME``, ``TEMPORAL_PROFILE``), so the
worker, the starter and the ``temporal`` CLI agree on one connection.

Precedence, lowest first: the service config's ``[temporal]`` section, the named profile (only when
one is named by ``--profile``, ``TEMPORAL_PROFILE``, ``temporal.profile`` or a ``TEMPORAL_CONFIG_FILE``
is set: an operator's personal default profile never silently redirects the service), ``TEMPORAL_*``
variables, then ``--address`` / ``--namespace``. The result is an ordinary ``ServiceConfig`` that
names secrets and key material only by where they live; they are read in ``connect_kwargs``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pydantic import ValidationError

from domain.config import (
    ConfigError,
    CredentialSource,
    ServiceConfig,
    TemporalSettings,
    is_loopback_host,
    split_address,
)
from domain.redact import register_secret

if TYPE_CHECKING:
    from temporalio.client import Client

# The temporalio and credential imports are inside the functions that use them: the starter imports
# this module for its flags, and refuses bad input before it needs the SDK (bench/refusal.py).


@dataclass(frozen=True)
class ConnectionFlags:
    """The command-line overrides shared by the starter and the worker."""

    address: str | None = None
    namespace: str | None = None
    profile: str | None = None


def connection_options(command: Callable) -> Callable:
    """Add ``--address``, ``--namespace`` and ``--profile`` to a click command (starter and worker)."""
    options = [
        click.option("--address", "temporal_address", metavar="HOST:PORT",
                     help="Temporal frontend (overrides TEMPORAL_ADDRESS, the profile and the config)."),
        click.option("--namespace", "temporal_namespace",
                     help="Temporal namespace (overrides TEMPORAL_NAMESPACE, the profile and the config)."),
        click.option("--profile", "temporal_profile",
                     help="Temporal client profile from $TEMPORAL_CONFIG_FILE or "
                          "~/.config/temporalio/temporal.toml (default: $TEMPORAL_PROFILE)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def flags_from(params: Mapping[str, Any]) -> ConnectionFlags:
    """The flags added by ``connection_options`` out of a click command's parameters."""
    return ConnectionFlags(params.get("temporal_address"), params.get("temporal_namespace"),
                           params.get("temporal_profile"))


def resolve_config(config: ServiceConfig, flags: ConnectionFlags | None = None,
                   env: Mapping[str, str] | None = None) -> ServiceConfig:
    """``config`` with the Temporal connection completed from the profile, TEMPORAL_* and flags."""
    return config.model_copy(update={"temporal": resolve_settings(config.temporal, flags, env)})


def resolve_settings(settings: TemporalSettings, flags: ConnectionFlags | None = None,
                     env: Mapping[str, str] | None = None) -> TemporalSettings:
    from temporalio.envconfig import ClientConfigProfile

    flags = flags or ConnectionFlags()
    env = dict(os.environ if env is None else env)
    profile_name = flags.profile or env.get("TEMPORAL_PROFILE") or settings.profile
    config_file = env.get("TEMPORAL_CONFIG_FILE")
    if config_file and not Path(config_file).expanduser().is_file():
        raise ConfigError(f"TEMPORAL_CONFIG_FILE={config_file}: Temporal client config file not found")
    use_file = bool(profile_name or config_file)
    if flags.profile:
        origin = f"--profile {flags.profile}"
    elif env.get("TEMPORAL_PROFILE"):
        origin = f"TEMPORAL_PROFILE={profile_name}"
    else:
        origin = f"config:temporal.profile={profile_name}"
    try:
        profile = ClientConfigProfile.load(profile=profile_name, disable_file=not use_file, override_env_vars=env)
        file_profile = (ClientConfigProfile.load(profile=profile_name, disable_env=True, override_env_vars=env)
                        if use_file else ClientConfigProfile())
    except Exception as e:  # the bridge raises its own ConfigError type
        raise ConfigError(f"Temporal client profile ({origin}): {e}") from None

    update: dict[str, Any] = {"profile": profile_name}
    if profile.address:
        update["address"] = profile.address
    if profile.namespace:
        update["namespace"] = profile.namespace
    if env.get("TEMPORAL_API_KEY"):
        update["api_key"] = CredentialSource(kind="env", name="TEMPORAL_API_KEY")
    elif file_profile.api_key:
        update["api_key"] = CredentialSource(kind="temporal_profile", name=profile_name or "default",
                                             path=config_file)
    if profile.api_key:
        update["tls"] = True  # an API key is only ever sent over TLS (the SDK's default too)
    if profile.tls is not None:
        tls = profile.tls
        update["tls"] = tls.disabled is not True
        for field, source, what in (
            ("tls_server_ca_cert_path", tls.server_root_ca_cert, "server CA certificate"),
            ("tls_client_cert_path", tls.client_cert, "client certificate"),
            ("tls_client_key_path", tls.client_private_key, "client key"),
        ):
            if source is None:
                continue
            if not isinstance(source, Path):
                raise ConfigError(f"Temporal client profile ({origin}): the TLS {what} is given inline; "
                                  f"mount it as a file and use its *_PATH setting instead")
            update[field] = str(source)
        if tls.server_name:
            update["tls_server_name"] = tls.server_name
    if flags.address:
        update["address"] = flags.address
    if flags.namespace:
        update["namespace"] = flags.namespace
    try:
        return TemporalSettings.model_validate({**settings.model_dump(), **{
            k: (v.model_dump() if isinstance(v, CredentialSource) else v) for k, v in update.items()}})
    except ValidationError as e:
        fields = "; ".join(f"temporal.{'.'.join(str(x) for x in err['loc']) or 'settings'}: "
                           f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors(include_input=False))
        raise ConfigError(f"{fields} (from the config, profile, TEMPORAL_* or flags)") from None
    except ValueError as e:
        raise ConfigError(f"temporal: {e}") from None


def _read_pem(path: str, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ConfigError(f"temporal.{what}: cannot read {path}: {e.strerror}") from None


def _api_key(source: CredentialSource) -> str:
    from temporalio.envconfig import ClientConfigProfile

    from clients.credentials import fetch_secret

    if source.kind != "temporal_profile":
        return fetch_secret(source, what="temporal.api_key")
    profile = ClientConfigProfile.load(profile=source.name, config_source=Path(source.path) if source.path else None,
                                       disable_env=True)
    if not profile.api_key:
        raise ConfigError(f"temporal.api_key: {source.describe()} has no api_key")
    register_secret(profile.api_key)
    return profile.api_key


def check_transport(settings: TemporalSettings) -> str | None:
    """Refuse an API key over plaintext to anything but loopback (``ConfigError``: one line, exit 2,
    before any byte is sent); return a warning for loopback (a local dev server has no TLS)."""
    if not settings.api_key or settings.uses_tls():
        return None
    from clients.http_guard import resolve_host

    host, _ = split_address(settings.address)
    if not is_loopback_host(host, resolve_host):  # a *.localhost name: only if it resolves to loopback
        raise ConfigError(f"temporal.api_key is set but TLS is off for {settings.address}: refusing to send the "
                          "API key in cleartext; set temporal.tls = true (or TEMPORAL_TLS=true), or drop the key")
    return (f"warning: the Temporal API key goes in cleartext to {settings.address} (loopback, so allowed); "
            "set temporal.tls = true for anything else")


def connect_kwargs(settings: TemporalSettings) -> dict[str, Any]:
    """Keyword arguments for ``Client.connect`` (secrets and key material are read here, not earlier)."""
    from temporalio.service import TLSConfig

    warning = check_transport(settings)  # before the key is read or anything is sent
    tls: bool | TLSConfig = settings.tls
    if settings.tls_client_cert_path or settings.tls_server_ca_cert_path or settings.tls_server_name:
        tls = TLSConfig(
            domain=settings.tls_server_name,
            server_root_ca_cert=(_read_pem(settings.tls_server_ca_cert_path, "tls_server_ca_cert_path")
                                 if settings.tls_server_ca_cert_path else None),
            client_cert=(_read_pem(settings.tls_client_cert_path, "tls_client_cert_path")
                         if settings.tls_client_cert_path else None),
            client_private_key=(_read_pem(settings.tls_client_key_path, "tls_client_key_path")
                                if settings.tls_client_key_path else None),
        )
    kwargs = {
        "target_host": settings.address,
        "namespace": settings.namespace,
        "api_key": _api_key(settings.api_key) if settings.api_key else None,
        "tls": tls,
    }
    if warning:
        click.echo(warning, err=True)
    return kwargs


def describe(settings: TemporalSettings) -> str:
    """Where the service connects, for logs and errors (never a secret)."""
    auth = [f"api key from {settings.api_key.describe()}"] if settings.api_key else []
    if settings.tls_client_cert_path:
        auth.append(f"mTLS {settings.tls_client_cert_path}")
    tls = "tls" if settings.tls or settings.tls_client_cert_path or settings.tls_server_ca_cert_path else "plaintext"
    return f"{settings.address} namespace={settings.namespace} ({', '.join([tls, *auth])})"


def codec_for(config: ServiceConfig):
    """The payload codec of this configuration (runtime/payload_codec.py): redaction, and encryption when
    keys are configured (read here; ``ConfigError`` naming the key or variable)."""
    from runtime.payload_codec import RedactingCodec, load_keys

    return RedactingCodec(load_keys(config.temporal.codec))


async def connect(config: ServiceConfig) -> Client:
    """A client for the (already resolved) configuration: the pydantic data converter with the payload
    codec and encoded failure attributes, so every byte sent to Temporal passes one boundary."""
    from temporalio.client import Client

    from runtime.payload_codec import data_converter

    codec = codec_for(config)  # before connecting: a bad key is refused before anything is sent
    return await Client.connect(**connect_kwargs(config.temporal), data_converter=data_converter(codec))


def workflow_ui_url(config: ServiceConfig, workflow_id: str) -> str | None:
    if not config.temporal.ui_url:
        return None
    base = config.temporal.ui_url.rstrip("/")
    return f"{base}/namespaces/{config.temporal.namespace}/workflows/{workflow_id}"
