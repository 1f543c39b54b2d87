"""The evidence store: failure logs and diagnostics that outlive the worker that captured them.

Why fsspec: one well-kept library gives the same put/get/list over a local directory (the sandbox
default), ``s3://`` (with ``s3fs``), ``gs://``, ``az://`` and caching chains, so production points the
store at an object bucket by configuration alone and nothing here parses URLs by hand.

Everything written is redacted first (``domain.redact``); what goes into Temporal history is only the
returned ``FileRef``: the store URI, its sha256 and its size.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from domain.models import FileRef
from domain.redact import redact


class EvidenceError(RuntimeError):
    """The store cannot be reached or a file is missing or altered; the message names the URI."""


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:120]


class EvidenceStore:
    """Write-once-per-name evidence files under ``<root>/<request id>/``."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 before_write: Callable[[], object] | None = None):
        self.url = url
        self.options = dict(storage_options or {})
        # Called before each write: the owner registers every configured secret for redaction, so a
        # file is redacted the same whichever process writes it (not only for secrets it happened to use).
        self.before_write = before_write
        try:
            self.fs, self.root = url_to_fs(url, **self.options)
        except (ImportError, ValueError) as e:  # unknown protocol or its package (e.g. s3fs) missing
            raise EvidenceError(f"evidence.url {url!r}: {e}") from None
        self.root = self.root.rstrip("/")

    def put_text(self, request_id: str, name: str, text: str) -> FileRef:
        """Redact, write whole (a retried activity rewrites the same name) and return the reference."""
        if self.before_write is not None:
            self.before_write()
        data = redact(text).encode()
        path = f"{self.root}/{safe_name(request_id)}/{safe_name(name)}"
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data)
        except OSError as e:
            raise EvidenceError(f"cannot write {self.fs.unstrip_protocol(path)}: {e}") from e
        return FileRef(uri=self.fs.unstrip_protocol(path), sha256=hashlib.sha256(data).hexdigest(),
                       size_bytes=len(data))


def read_named(store: EvidenceStore, request_id: str, name: str) -> str | None:
    """The text of ``name`` written earlier for ``request_id`` (None: no such file). For a record written before
    a side effect and read back after it (the tag's digest before a job's submission), not for checked evidence."""
    path = f"{store.root}/{safe_name(request_id)}/{safe_name(name)}"
    try:
        with store.fs.open(path, "rb") as f:
            return f.read(1 << 20).decode()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise EvidenceError(f"cannot read {store.fs.unstrip_protocol(path)}: {e}") from e


def read_evidence(ref: FileRef, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The file's bytes, checked against the size and digest history recorded for it: at most one byte
    more than the recorded size is read, so a replaced or growing object is refused, not read whole."""
    try:
        with fsspec.open(ref.uri, "rb", **dict(storage_options or {})) as f:
            data = f.read(ref.size_bytes + 1)
    except FileNotFoundError:
        raise EvidenceError(f"{ref.uri}: not found in the evidence store") from None
    except (OSError, ImportError, ValueError) as e:
        raise EvidenceError(f"{ref.uri}: {e}") from None
    if len(data) > ref.size_bytes:
        raise EvidenceError(f"{ref.uri}: larger than the recorded {ref.size_bytes} bytes; refused, not read further")
    digest = hashlib.sha256(data).hexdigest()
    if digest != ref.sha256:
        raise EvidenceError(f"{ref.uri}: sha256 {digest[:16]}… does not match the recorded {ref.sha256[:16]}…")
    return data
