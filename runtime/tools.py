"""Check, before polling, that this machine can run the configuration: every executable it names is
on PATH and the evidence store's protocol is installed (``s3://`` needs the ``s3`` extra)."""

from __future__ import annotations

import shutil

import fsspec

from domain.config import ServiceConfig


def missing_tools(config: ServiceConfig, path: str | None = None) -> list[str]:
    """One line per missing piece, naming the configuration key that needs it."""
    missing = [f"{tool!r} not found on PATH (needed by {why})"
               for tool, why in config.required_tools().items() if shutil.which(tool, path=path) is None]
    url = config.evidence_url()
    protocol, _ = fsspec.core.split_protocol(url)
    if protocol:
        try:
            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as e:
            missing.append(f"evidence store {url} (config:evidence.url) cannot be opened here: {e}")
    return missing
