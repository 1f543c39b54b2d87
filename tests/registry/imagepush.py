"""Push synthetic images to a local registry over plain HTTP (no Docker engine).

Layers are tar+gzip with mtime=0, so digests are reproducible; the config carries real
``rootfs.diff_ids`` (sha256 of the uncompressed tar) and ``config.Labels``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field

import httpx

from domain.validation import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST

DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
GOOD_SOURCE = "https://github.com/marin-community/MarinSkyRL"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Layer:
    blob: bytes
    diff_id: str

    @property
    def digest(self) -> str:
        return sha256(self.blob)


def make_layer(files: dict[str, bytes]) -> Layer:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return Layer(blob=gzip.compress(raw, mtime=0), diff_id=sha256(raw))


@dataclass
class ImageSpec:
    """What to push for one platform."""

    platform: str = "linux/amd64"
    labels: dict[str, str] | None = field(default_factory=dict)
    layers: int = 3
    seed: str = "x"
    layer_bytes: int = 64  # payload per layer (random-ish bytes so gzip cannot shrink them)
    docker: bool = False  # Docker schema2 media types instead of OCI
    drop_diff_ids: int = 0  # corrupt the config: fewer diff_ids than layers
    config_arch: str | None = None  # override what the config says (e.g. "aarch64" or a lie)


@dataclass(frozen=True)
class PushedImage:
    digest: str
    manifest: bytes
    media_type: str
    config_digest: str
    layer_sizes: tuple[int, ...]


class Pusher:
    """Authenticated pusher: Bearer via the token realm with Basic creds, or Basic, or anonymous."""

    def __init__(self, base_url: str, credentials: tuple[str, str] | None = None) -> None:
        self.base_url = base_url
        self._creds = credentials
        self._http = httpx.AsyncClient(trust_env=False, timeout=30)
        self._auth: dict[str, str] = {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _headers(self, repo: str) -> dict[str, str]:
        if repo in self._auth:
            return {"Authorization": self._auth[repo]}
        resp = await self._http.get(f"{self.base_url}/v2/")
        challenge = resp.headers.get("www-authenticate", "")
        if resp.status_code == 200 or not self._creds:
            value = ""
        elif challenge.lower().startswith("basic"):
            value = "Basic " + base64.b64encode(":".join(self._creds).encode()).decode()
        else:
            params = dict(kv.split("=", 1) for kv in challenge.split(" ", 1)[1].split(","))
            params = {k: v.strip('"') for k, v in params.items()}
            tok = await self._http.get(params["realm"], auth=self._creds,
                                       params={"service": params["service"],
                                               "scope": f"repository:{repo}:pull,push"})
            tok.raise_for_status()
            value = "Bearer " + tok.json()["token"]
        self._auth[repo] = value
        return {"Authorization": value} if value else {}

    async def push_blob(self, repo: str, data: bytes) -> str:
        digest = sha256(data)
        h = await self._headers(repo)
        head = await self._http.head(f"{self.base_url}/v2/{repo}/blobs/{digest}", headers=h)
        if head.status_code == 200:
            return digest
        start = await self._http.post(f"{self.base_url}/v2/{repo}/blobs/uploads/", headers=h)
        assert start.status_code == 202, start.text
        loc = httpx.URL(self.base_url).join(start.headers["location"]).copy_merge_params({"digest": digest})
        put = await self._http.put(loc, content=data,
                                   headers={**h, "Content-Type": "application/octet-stream"})
        assert put.status_code == 201, put.text
        return digest

    async def push_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        h = await self._headers(repo)
        resp = await self._http.put(f"{self.base_url}/v2/{repo}/manifests/{ref}", content=body,
                                    headers={**h, "Content-Type": media_type})
        assert resp.status_code == 201, resp.text
        assert resp.headers["docker-content-digest"] == sha256(body)
        return sha256(body)

    async def push_image(self, repo: str, ref: str | None, spec: ImageSpec) -> PushedImage:
        """Push one image manifest (by digest when ``ref`` is None)."""
        os_, arch, *variant = spec.platform.split("/")
        layers = [make_layer({f"{spec.seed}/{i}.bin": _payload(f"{spec.seed}:{i}", spec.layer_bytes)})
                  for i in range(spec.layers)]
        config: dict[str, object] = {
            "architecture": spec.config_arch or arch, "os": os_,
            "config": {"Labels": spec.labels, "Env": ["PATH=/usr/bin"]},
            "rootfs": {"type": "layers",
                       "diff_ids": [x.diff_id for x in layers][: len(layers) - spec.drop_diff_ids]},
        }
        if variant:
            config["variant"] = variant[0]
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_digest = await self.push_blob(repo, config_bytes)
        for layer in layers:
            await self.push_blob(repo, layer.blob)
        media_type = DOCKER_MANIFEST if spec.docker else OCI_MANIFEST
        manifest = {
            "schemaVersion": 2, "mediaType": media_type,
            "config": {"mediaType": DOCKER_CONFIG if spec.docker else OCI_CONFIG,
                       "digest": config_digest, "size": len(config_bytes)},
            "layers": [{"mediaType": DOCKER_LAYER if spec.docker else OCI_LAYER,
                        "digest": x.digest, "size": len(x.blob)} for x in layers],
        }
        body = json.dumps(manifest, indent=2).encode()
        digest = sha256(body)
        await self.push_manifest(repo, ref or digest, body, media_type)
        return PushedImage(digest, body, media_type, config_digest, tuple(len(x.blob) for x in layers))

    async def push_attestation(self, repo: str, subject: str) -> tuple[str, int]:
        """A buildx-style provenance manifest (in-toto layer, dummy config)."""
        statement = json.dumps({"_type": "https://in-toto.io/Statement/v0.1",
                                "subject": [{"digest": {"sha256": subject.split(":")[1]}}],
                                "predicateType": "https://slsa.dev/provenance/v0.2"}).encode()
        cfg = b"{}"
        await self.push_blob(repo, cfg)
        await self.push_blob(repo, statement)
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": sha256(cfg), "size": len(cfg)},
                           "layers": [{"mediaType": "application/vnd.in-toto+json", "digest": sha256(statement),
                                       "size": len(statement)}]}).encode()
        return await self.push_manifest(repo, sha256(body), body, OCI_MANIFEST), len(body)

    async def push_index(self, repo: str, tag: str, specs: list[ImageSpec], *, attestation: bool = True,
                         docker: bool = False) -> tuple[str, list[PushedImage]]:
        """Push each platform image by digest, optional attestation entries, then the index under ``tag``."""
        entries: list[dict[str, object]] = []
        images = []
        for spec in specs:
            img = await self.push_image(repo, None, spec)
            images.append(img)
            os_, arch, *variant = spec.platform.split("/")
            platform = {"os": os_, "architecture": arch, **({"variant": variant[0]} if variant else {})}
            entries.append({"mediaType": img.media_type, "digest": img.digest, "size": len(img.manifest),
                            "platform": platform})
            if attestation:
                att, size = await self.push_attestation(repo, img.digest)
                entries.append({"mediaType": OCI_MANIFEST, "digest": att, "size": size,
                                "platform": {"os": "unknown", "architecture": "unknown"},
                                "annotations": {"vnd.docker.reference.type": "attestation-manifest",
                                                "vnd.docker.reference.digest": img.digest}})
        media_type = DOCKER_LIST if docker else OCI_INDEX
        body = json.dumps({"schemaVersion": 2, "mediaType": media_type, "manifests": entries}).encode()
        return await self.push_manifest(repo, tag, body, media_type), images


def good_labels(revision: str = "a" * 40, harbor: str = "b" * 40) -> dict[str, str]:
    return {"org.opencontainers.image.source": GOOD_SOURCE, "org.opencontainers.image.revision": revision,
            "org.marin.harbor-commit": harbor}


def _payload(seed: str, size: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return out[:size]
