"""The environment of every subprocess we start: an allow-list, never the worker's whole environment.

Why: the worker's environment may hold the service's credentials (``kind = "env"`` sources, the
Temporal API key, cloud credentials of the evidence store). The lint command is repository code, git
runs hooks and helpers, kubectl runs exec auth plugins, a credential command is a third-party CLI; none
needs the others' credentials, and a credential a child does need is passed to it explicitly (``extra``).
Every process production code starts goes through ``child_env`` (git via GitPython's spawn point, the
bwrap rehearsal builds its environment from nothing). Only what a tool needs to run at all is kept (PATH, HOME, locale, temp
dir, CA bundle, proxies); anything whose value is a registered secret is dropped even if allow-listed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from domain.redact import registered_secrets

ALLOWED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TEMP", "TMP",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "UV_CACHE_DIR", "VIRTUAL_ENV", "PYTHONPATH",
})
ALLOWED_PREFIXES = ("LC_",)
# What particular tools need on top (names of pointers to configuration, never credentials themselves).
# kubectl: its kubeconfig, in-cluster discovery, and the files/profiles its exec auth plugins read
# (gke-gcloud-auth-plugin, aws eks get-token); a plugin that needs a secret gets it from its kubeconfig's
# ``exec.env`` or a credentials file, not from the worker's environment.
KUBECTL = frozenset({
    "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
    "CLOUDSDK_CONFIG", "CLOUDSDK_CORE_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS", "USE_GKE_GCLOUD_AUTH_PLUGIN",
    "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
})
# A credential command (``gh auth token``, a vault/cloud CLI): where its own configuration lives.
CREDENTIAL_COMMAND = frozenset({"GH_CONFIG_DIR", "GH_HOST", "VAULT_ADDR", "VAULT_NAMESPACE", "VAULT_CACERT"}) | KUBECTL
# git's own variables the service sets explicitly (``GIT_TERMINAL_PROMPT``, ``GIT_ASKPASS``, ``GIT_CONFIG_*``
# with a per-command http.extraHeader) arrive through ``extra``; none is inherited.


def child_env(extra: Mapping[str, str] | None = None, *, allow: Iterable[str] = (),
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An allow-listed copy of ``base`` (default ``os.environ``) plus ``extra`` (passed on as given).

    ``allow``: more variable names a particular tool needs (e.g. ``KUBECONFIG`` for kubectl)."""
    base = os.environ if base is None else base
    allowed = ALLOWED | set(allow)
    secrets = set(registered_secrets())
    env = {k: v for k, v in base.items()
           if (k in allowed or k.startswith(ALLOWED_PREFIXES)) and v not in secrets}
    env.update(extra or {})
    return env
