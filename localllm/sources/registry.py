"""Ollama registry source: ``smollm2:135m``, ``registry.ollama.ai/library/llama3.2:1b``...

The protocol is the OCI distribution one Ollama uses: ``GET /v2/<ns>/<model>/manifests/<tag>``
names the config and layer blobs, ``GET /v2/<ns>/<model>/blobs/<digest>`` serves each (with
Range). The manifest is stored as the model's manifest, so the template, system, params (the
model's default options), license and messages layers work as they do in Ollama.

Authentication: a ``401`` with ``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` is
answered by fetching a token from the realm (Docker's token flow) and repeating the request with
it. Ollama's signed-key authentication for private models is not implemented.

Redirects: same-host redirects are followed. A blob request may be redirected to another host
(a CDN): that URL is fetched without the registry's credentials. A manifest or token request
that leaves the registry's host is refused.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urljoin

import httpx

from .._exceptions import (
    AuthRequiredError,
    NetworkError,
    PullError,
    RemoteNotFoundError,
    StoreError,
)
from ..settings import Settings
from ..store.manifest import MAX_MANIFEST_BYTES, MEDIA_MANIFEST, MEDIA_MODEL, Manifest
from ..store.names import DEFAULT_HOST, ModelName
from ..store.store import Store
from .http import MAX_REDIRECTS, TransientError, same_host, shared_client, transient_status
from .plan import PlannedBlob, PullPlan
from .progress import STATUS_MANIFEST, PullProgress

__all__ = ["RegistryClient", "plan_registry", "registry_base_url"]

_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")
_ACCEPT = f"{MEDIA_MANIFEST}, application/vnd.oci.image.manifest.v1+json"
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
# An Ollama config blob is a few hundred bytes; read at most this much of it.
_MAX_CONFIG = 1 << 20


def registry_base_url(name: ModelName, settings: Settings, insecure: bool = False) -> str:
    """Base URL of the registry serving ``name``.

    The default host maps to :attr:`Settings.registry`; any other host is reached over HTTPS,
    or plain HTTP when ``insecure`` is set or the host is this machine (loopback).
    """
    if name.host == DEFAULT_HOST:
        return settings.registry.rstrip("/")
    bare_host = name.host.rsplit(":", 1)[0] if not name.host.startswith("[") else name.host
    scheme = "http" if insecure or bare_host in _LOOPBACK else "https"
    return f"{scheme}://{name.host}"


def parse_bearer_challenge(header: str | None) -> dict[str, str] | None:
    """``{realm, service, scope}`` from ``WWW-Authenticate: Bearer ...``, else ``None``."""
    if not header or not header.strip().lower().startswith("bearer "):
        return None
    params = dict(_CHALLENGE_PARAM.findall(header))
    return params if params.get("realm") else None


@dataclass
class RegistryClient:
    """Talks to one registry about one repository; keeps the bearer token between requests."""

    base_url: str
    """``https://registry.ollama.ai`` or another registry."""
    repository: str
    """``namespace/model``."""
    _token: str | None = field(default=None, repr=False)
    _token_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def host(self) -> str:
        """The registry's host name."""
        return httpx.URL(self.base_url).host

    def _auth_headers(self) -> dict[str, str]:
        with self._token_lock:
            return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _fetch_token(self, client: httpx.Client, challenge: dict[str, str]) -> None:
        realm = challenge["realm"]
        params = {"service": challenge.get("service", self.host)}
        params["scope"] = challenge.get("scope", f"repository:{self.repository}:pull")
        try:
            response = client.get(realm, params=params, follow_redirects=False)
        except httpx.TransportError as exc:
            raise TransientError(f"token request to {httpx.URL(realm).host} failed: {exc}") from exc
        if response.status_code in (401, 403):
            raise AuthRequiredError(
                f"the registry {self.host} refused access to {self.repository} (HTTP "
                f"{response.status_code}): the model may be private"
            )
        if transient_status(response.status_code):
            raise TransientError(f"token request answered HTTP {response.status_code}")
        try:
            data = response.json()
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise PullError(f"the registry {self.host} answered the token request without a token")
        with self._token_lock:
            self._token = token

    def request(
        self, client: httpx.Client, path: str, headers: dict[str, str], *, blob: bool
    ) -> httpx.Response:
        """Streamed GET of ``path`` with auth, the token challenge and the redirect rules.

        Returns the final response, whatever its status; the caller closes it.
        """
        url = f"{self.base_url}{path}"
        challenged = False
        for _ in range(MAX_REDIRECTS):
            request = client.build_request("GET", url, headers={**headers, **self._auth_headers()})
            response = client.send(request, stream=True)
            if response.status_code == 401 and not challenged:
                challenge = parse_bearer_challenge(response.headers.get("www-authenticate"))
                if challenge is not None:
                    response.close()
                    self._fetch_token(client, challenge)
                    challenged = True
                    continue
            if not response.is_redirect:
                return response
            target = urljoin(str(response.url), response.headers["location"])
            response.close()
            if same_host(target, self.base_url):
                url = target
                continue
            if not blob:
                raise PullError(
                    f"the registry {self.host} redirected a manifest request to "
                    f"{httpx.URL(target).host}; only blob downloads may leave the registry"
                )
            # A blob on a CDN: fetched without the registry's credentials, following the CDN's
            # own redirects (httpx drops Authorization on cross-origin hops anyway).
            request = client.build_request("GET", target, headers=headers)
            return client.send(request, stream=True, follow_redirects=True)
        raise PullError(f"the registry {self.host} redirected more than {MAX_REDIRECTS} times")

    def manifest(self, client: httpx.Client, name: ModelName) -> Manifest:
        """Fetch and validate the manifest of ``name``."""
        path = f"/v2/{self.repository}/manifests/{name.tag}"
        try:
            response = self.request(client, path, {"Accept": _ACCEPT}, blob=False)
        except (httpx.TransportError, TransientError) as exc:
            raise NetworkError(
                f"cannot reach the registry {self.host} ({type(exc).__name__}: {exc}); check "
                "the network connection"
            ) from None
        try:
            status = response.status_code
            if status == 404:
                raise RemoteNotFoundError(
                    f'model "{name.short}" was not found in the registry {self.host}; check the '
                    "name and tag"
                )
            if status in (401, 403):
                raise AuthRequiredError(
                    f"the registry {self.host} requires authentication for {self.repository} "
                    f"(HTTP {status})"
                )
            if status != 200:
                raise PullError(f"the registry {self.host} answered HTTP {status} for {name}")
            raw = bytearray()
            for chunk in response.iter_raw():
                raw += chunk
                if len(raw) > MAX_MANIFEST_BYTES:
                    raise PullError(f"the manifest of {name} from {self.host} is too large")
        finally:
            response.close()
        try:
            manifest = Manifest.from_bytes(bytes(raw))
        except StoreError as exc:
            raise PullError(
                f"the registry {self.host} sent a bad manifest for {name}: {exc}"
            ) from None
        if manifest.layer(MEDIA_MODEL) is None:
            raise PullError(f"{name} has no model layer; it is not a model localllm can run")
        return manifest

    def blob_source(self, digest: str) -> RegistryBlobSource:
        """The download source of one blob of this repository."""
        return RegistryBlobSource(self, digest)


@dataclass(frozen=True)
class RegistryBlobSource:
    """``/v2/<ns>/<model>/blobs/<digest>``, possibly redirected to a CDN."""

    registry: RegistryClient
    digest: str

    @property
    def description(self) -> str:
        """``registry.ollama.ai/library/smollm2 sha256:abcd…``."""
        return f"{self.registry.host}/{self.registry.repository} {self.digest[:19]}"

    def open(self, client: httpx.Client, offset: int) -> httpx.Response:
        """GET the blob from byte ``offset`` (see :class:`~.transfer.BlobSource`)."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        path = f"/v2/{self.registry.repository}/blobs/{self.digest}"
        response = self.registry.request(client, path, headers, blob=True)
        status = response.status_code
        if status in (200, 206, 416):
            return response
        response.close()
        from_registry = same_host(response.url, self.registry.base_url)
        if status in (401, 403) and from_registry:
            raise AuthRequiredError(
                f"the registry {self.registry.host} refused the blob {self.digest[:19]} "
                f"(HTTP {status})"
            )
        if status == 404 and from_registry:
            raise RemoteNotFoundError(f"the registry has no blob {self.digest}")
        if transient_status(status) or not from_registry:
            # A CDN's 403/404 is usually an expired signed link: ask the registry again.
            raise TransientError(f"HTTP {status} from {response.url.host}")
        raise PullError(f"{self.description}: unexpected HTTP {status}")


def plan_registry(
    store: Store,
    name: ModelName,
    settings: Settings,
    emit: Callable[[PullProgress], None],
    *,
    insecure: bool = False,
    cancel: threading.Event | None = None,
) -> PullPlan:
    """Resolve ``name`` on its registry: fetch the manifest and the (small) config blob."""
    registry = RegistryClient(
        base_url=registry_base_url(name, settings, insecure),
        repository=f"{name.namespace}/{name.model}",
    )
    emit(PullProgress(STATUS_MANIFEST))
    manifest = registry.manifest(shared_client(settings), name)
    config = manifest.config
    if config.size > _MAX_CONFIG:
        raise PullError(f"the config blob of {name} is {config.size} bytes; that is not a config")
    # The config says the model's file type: fetch it first so a doomed --quantize fails fast.
    config_blob = PlannedBlob(config.digest, config.size, registry.blob_source(config.digest))
    config_blob.fetch(store, settings, emit, cancel)
    file_type = None
    try:
        document = json.loads(store.read_blob(config.digest, limit=_MAX_CONFIG))
        if isinstance(document, dict) and isinstance(document.get("file_type"), str):
            file_type = document["file_type"].upper()
    except (ValueError, UnicodeDecodeError):
        pass
    blobs = tuple(
        PlannedBlob(layer.digest, layer.size, registry.blob_source(layer.digest))
        for layer in manifest.layers
    )

    return PullPlan(blobs=blobs, build=lambda: manifest, file_type=file_type)
