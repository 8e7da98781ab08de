"""A loopback Ollama registry: manifests, blobs with Range, Docker's bearer-token challenge.

* ``GET /v2/<ns>/<model>/manifests/<tag>``: the manifest (``404`` with an OCI error if unknown).
* ``GET /v2/<ns>/<model>/blobs/<digest>``: the blob, or a ``307`` to the CDN (another loopback
  host) when :attr:`FakeRegistry.blobs_on_cdn` is set.
* ``GET /token?service=...&scope=...``: ``{"token": ...}``. With :attr:`FakeRegistry.require_token`
  every ``/v2/`` request without ``Authorization: Bearer <token>`` gets ``401`` and
  ``WWW-Authenticate: Bearer realm="<url>/token",service="...",scope="repository:<repo>:pull"``.
* :attr:`FakeRegistry.manifest_redirect`: answer manifest requests with a ``307`` to that URL
  (to check that a client refuses to follow a manifest off the registry's host).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qs

from .server import LoopbackServer, RequestHandler, bind_host

__all__ = ["FakeRegistry", "RegistryCDN", "build_manifest"]

MEDIA_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_CONFIG = "application/vnd.docker.container.image.v1+json"


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def build_manifest(config: bytes, layers: list[tuple[str, bytes]]) -> bytes:
    """An Ollama manifest for a config blob and ``(media type, bytes)`` layers."""
    document = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
        "layers": [
            {"mediaType": media_type, "digest": _digest(data), "size": len(data)}
            for media_type, data in layers
        ],
    }
    return json.dumps(document, indent=2).encode()


class RegistryCDN(LoopbackServer):
    """Blob storage on another loopback host, at ``/blobs/<digest>``."""

    def __init__(self) -> None:
        super().__init__(bind_host("127.0.0.2"))
        self.blobs: dict[str, bytes] = {}

    def route(self, handler: RequestHandler) -> None:
        data = self.blobs.get(handler.path.split("?", 1)[0].removeprefix("/blobs/"))
        if data is None:
            handler.send_empty(404)
            return
        self.send_file(handler, data)


@dataclass
class _Model:
    manifest: bytes
    blobs: dict[str, bytes]


class FakeRegistry(LoopbackServer):
    """The registry; its :attr:`cdn` starts and stops with it."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1")
        self.cdn = RegistryCDN()
        self.companions.append(self.cdn)
        self.models: dict[tuple[str, str], _Model] = {}
        self.require_token = False
        self.token = "registry-" + secrets.token_hex(8)
        self.blobs_on_cdn = False
        self.manifest_redirect: str | None = None
        self.token_requests: list[dict[str, list[str]]] = []

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``, the host part of model names served by this registry."""
        return self.url.removeprefix("http://")

    def add_model(
        self, repository: str, tag: str, config: bytes, layers: list[tuple[str, bytes]]
    ) -> bytes:
        """Publish ``repository:tag`` (``namespace/model``); returns the manifest bytes."""
        manifest = build_manifest(config, layers)
        blobs = {_digest(config): config, **{_digest(data): data for _, data in layers}}
        self.models[(repository, tag)] = _Model(manifest, blobs)
        self.cdn.blobs.update(blobs)
        return manifest

    def route(self, handler: RequestHandler) -> None:
        path, _, query = handler.path.partition("?")
        if path == "/token":
            self.token_requests.append(parse_qs(query))
            handler.send_json(200, {"token": self.token, "expires_in": 300})
            return
        if not path.startswith("/v2/"):
            handler.send_empty(404)
            return
        repository, kind, reference = self._split(path)
        if self.require_token and handler.headers.get("Authorization") != f"Bearer {self.token}":
            challenge = (
                f'Bearer realm="{self.url}/token",service="fake-registry",'
                f'scope="repository:{repository}:pull"'
            )
            handler.send_json(
                401,
                {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]},
                {"WWW-Authenticate": challenge},
            )
            return
        if kind == "manifests":
            self._manifest(handler, repository, reference)
        elif kind == "blobs":
            self._blob(handler, repository, reference)
        else:
            handler.send_empty(404)

    @staticmethod
    def _split(path: str) -> tuple[str, str, str]:
        parts = path.removeprefix("/v2/").split("/")
        if len(parts) < 4:
            return "", "", ""
        return "/".join(parts[:-2]), parts[-2], parts[-1]

    def _manifest(self, handler: RequestHandler, repository: str, tag: str) -> None:
        if self.manifest_redirect is not None:
            handler.redirect(307, self.manifest_redirect)
            return
        model = self.models.get((repository, tag))
        if model is None:
            handler.send_json(
                404,
                {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]},
            )
            return
        handler.send_bytes(200, model.manifest, MEDIA_MANIFEST)

    def _blob(self, handler: RequestHandler, repository: str, digest: str) -> None:
        model = next(
            (m for (repo, _), m in self.models.items() if repo == repository and digest in m.blobs),
            None,
        )
        if model is None:
            handler.send_json(
                404, {"errors": [{"code": "BLOB_UNKNOWN", "message": "blob unknown"}]}
            )
            return
        if self.blobs_on_cdn:
            handler.redirect(307, f"{self.cdn.url}/blobs/{digest}?sig={secrets.token_hex(8)}")
            return
        self.send_file(handler, model.blobs[digest])
