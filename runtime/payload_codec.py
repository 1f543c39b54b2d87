"""One boundary for every byte the worker and the starter send to Temporal: a ``PayloadCodec``.

Why Temporal's codec: the SDK runs it on every payload it sends (workflow and activity inputs and
results, failure details, heartbeat details, memos, queries, updates, signals, Current Details) and, with
``DefaultFailureConverterWithEncodedAttributes``, on failure messages and stack traces too, which it then
moves into a payload. So redaction no longer depends on each sink remembering to call ``redact`` (a
preflight report attached as failure ``details`` once reached history raw). Search attributes are the one
thing the SDK leaves unencoded (the server indexes them): ours are enum values and commit SHAs only
(runtime/search_attributes.py checks each value).

Encode: every payload is redacted (``domain.redact``, JSON re-serialized so it stays valid); with keys
configured it is then encrypted whole with AES-GCM (the ``cryptography`` package, the standard
authenticated cipher), metadata ``encoding: binary/encrypted`` and ``encryption-key-id``. Decode: an
encrypted payload is decrypted with the key its id names (every configured key is accepted, so keys
rotate: add the new key first, keep the old ones until their histories age out); anything else passes.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec

from domain.config import CodecSettings, ConfigError
from domain.redact import REDACTED, redact

KEYS_ENV = "GPU_RL_BUILDER_CODEC_KEYS"
ENCRYPTED = b"binary/encrypted"
KEY_ID = "encryption-key-id"
CIPHER = "encryption-cipher"
_NONCE = 12
_TEXT_ENCODINGS = (b"json/plain", b"json/protobuf")


class CodecError(ValueError):
    """A payload that cannot be decoded (unknown key id, tampered data); names the key id, never a key."""


def _redact_json(value):
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: _redact_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_json(v) for v in value]
    return value


def redact_payload(p: Payload) -> Payload:
    """``p`` with every secret redacted; the same object when it holds none (the common case: one pass)."""
    encoding = p.metadata.get("encoding", b"")
    if encoding == b"binary/null" or not p.data:
        return p
    text = p.data.decode("utf-8", errors="surrogateescape")
    cleaned = redact(text)
    if cleaned == text:
        return p
    data: bytes | None = None
    if encoding in _TEXT_ENCODINGS:
        try:  # string by string, so the JSON stays valid and only the secret's own text goes
            out = json.dumps(_redact_json(json.loads(text)), ensure_ascii=False, separators=(",", ":"))
            if redact(out) == out:
                data = out.encode()
        except ValueError:
            pass
        if data is None:  # a secret across strings (rare): the whole text's redaction, if still JSON
            try:
                json.loads(cleaned)
                data = cleaned.encode("utf-8", errors="surrogateescape")
            except ValueError:
                data = json.dumps(REDACTED).encode()
    elif encoding == b"binary/plain":
        data = cleaned.encode("utf-8", errors="surrogateescape")
    else:  # an encoding we cannot rewrite in place: the whole value goes
        data = json.dumps(REDACTED).encode()
        encoding = b"json/plain"
    out = Payload()
    out.CopyFrom(p)
    out.data = data
    out.metadata["encoding"] = encoding
    return out


@dataclass(frozen=True)
class Keys:
    """The AES-GCM keys by id; ``primary`` encrypts."""

    primary: str
    by_id: Mapping[str, bytes]


def _key_bytes(text: str, where: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: not base64 (expected base64 of 16, 24 or 32 random bytes)") from None
    if len(key) not in (16, 24, 32):
        raise ConfigError(f"{where}: {len(key)} bytes; an AES key is 16, 24 or 32 bytes (base64)")
    return key


def load_keys(settings: CodecSettings, env: Mapping[str, str] | None = None) -> Keys | None:
    """The configured keys (``GPU_RL_BUILDER_CODEC_KEYS`` first, else ``temporal.codec.keys``), read now
    and registered for redaction; None when there are none (refused if ``require_encryption``)."""
    from clients.credentials import fetch_secret
    from domain.redact import register_secret

    env = os.environ if env is None else env
    pairs: list[tuple[str, bytes]] = []
    if raw := env.get(KEYS_ENV, "").strip():
        for i, item in enumerate(x for x in raw.split(",") if x.strip()):
            kid, sep, b64 = item.strip().partition("=")
            if not sep or not kid:
                raise ConfigError(f"{KEYS_ENV}: item {i + 1} is not id=base64key")
            register_secret(b64.strip())
            pairs.append((kid, _key_bytes(b64, f"{KEYS_ENV}: key {kid}")))
    else:
        for i, k in enumerate(settings.keys):
            pairs.append((k.id, _key_bytes(fetch_secret(k.key, what=f"temporal.codec.keys[{i}].key"),
                                           f"temporal.codec.keys[{i}].key ({k.key.describe()})")))
    if not pairs:
        if settings.require_encryption:
            raise ConfigError(f"temporal.codec.require_encryption is set but no key is configured: set "
                              f"temporal.codec.keys or {KEYS_ENV}")
        return None
    ids = [k for k, _ in pairs]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{KEYS_ENV}: duplicate key id")
    return Keys(primary=pairs[0][0], by_id=dict(pairs))


class RedactingCodec(PayloadCodec):
    """Redacts every payload; with ``keys``, encrypts it (AES-GCM, the primary key) and decrypts by key id."""

    def __init__(self, keys: Keys | None = None):
        self.keys = keys

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encode_one(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decode_one(p) for p in payloads]

    def encode_one(self, p: Payload) -> Payload:
        p = redact_payload(p)
        if self.keys is None:
            return p
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        kid = self.keys.primary
        nonce = os.urandom(_NONCE)
        sealed = AESGCM(self.keys.by_id[kid]).encrypt(nonce, p.SerializeToString(), kid.encode())
        return Payload(metadata={"encoding": ENCRYPTED, KEY_ID: kid.encode(), CIPHER: b"AES-GCM"},
                       data=nonce + sealed)

    def decode_one(self, p: Payload) -> Payload:
        if p.metadata.get("encoding") != ENCRYPTED:
            return p
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        kid = p.metadata.get(KEY_ID, b"").decode(errors="replace")
        key = self.keys.by_id.get(kid) if self.keys else None
        if key is None:
            known = ", ".join(self.keys.by_id) if self.keys else "none"
            raise CodecError(f"payload encrypted with key id {kid!r}, which is not configured (configured: "
                             f"{known}); set temporal.codec.keys or {KEYS_ENV}")
        try:
            plain = AESGCM(key).decrypt(p.data[:_NONCE], p.data[_NONCE:], kid.encode())
        except InvalidTag:
            raise CodecError(f"payload with key id {kid!r} does not decrypt (another key under that id, or "
                             "altered data)") from None
        return Payload.FromString(plain)


def data_converter(codec: PayloadCodec | None) -> DataConverter:
    """The pydantic data converter with the codec, and failure messages and stack traces moved into an
    encoded payload (``encode_common_attributes``) so they pass the codec too."""
    from temporalio.contrib.pydantic import PydanticPayloadConverter

    return DataConverter(payload_converter_class=PydanticPayloadConverter, payload_codec=codec,
                         failure_converter_class=DefaultFailureConverterWithEncodedAttributes)
