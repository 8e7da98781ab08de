"""Manifests and digests in Ollama's (OCI-like) format.

A manifest names a config blob and a list of layers, each a content digest with a media type.
Parsing is defensive: manifests come from registries and from disk, and every digest in one is
validated before it can become a path.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .._exceptions import InvalidDigestError, StoreError

__all__ = [
    "ANNOTATION_SCALE",
    "MEDIA_ADAPTER",
    "MEDIA_CONFIG",
    "MEDIA_DRAFT",
    "MEDIA_LICENSE",
    "MEDIA_MANIFEST",
    "MEDIA_MESSAGES",
    "MEDIA_MODEL",
    "MEDIA_PARAMS",
    "MEDIA_PROJECTOR",
    "MEDIA_SYSTEM",
    "MEDIA_TEMPLATE",
    "Layer",
    "Manifest",
    "normalize_digest",
]

MEDIA_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_MODEL = "application/vnd.ollama.image.model"
MEDIA_TEMPLATE = "application/vnd.ollama.image.template"
MEDIA_SYSTEM = "application/vnd.ollama.image.system"
MEDIA_PARAMS = "application/vnd.ollama.image.params"
MEDIA_LICENSE = "application/vnd.ollama.image.license"
MEDIA_MESSAGES = "application/vnd.ollama.image.messages"
MEDIA_ADAPTER = "application/vnd.ollama.image.adapter"
"""A LoRA adapter's GGUF (Modelfile ``ADAPTER``), applied to the model layer's weights."""
MEDIA_PROJECTOR = "application/vnd.ollama.image.projector"
MEDIA_DRAFT = "application/vnd.ollama.image.draft"
"""A draft model's GGUF (Modelfile ``DRAFT``), for speculative decoding."""

_DIGEST_RE = re.compile(r"sha256[:\-]([0-9a-f]{64})")
# Manifests are small JSON documents; anything bigger is not one.
MAX_MANIFEST_BYTES = 1 << 20
MAX_LAYERS = 256
ANNOTATION_SCALE = "org.localllm.adapter.scale"
"""The annotation of an adapter layer that holds its scale (Modelfile ``ADAPTER path SCALE``;
absent means 1.0, as Ollama applies every adapter)."""
_MAX_ANNOTATIONS = 16


def normalize_digest(digest: str) -> str:
    """Return ``sha256:<hex>`` for ``sha256:<hex>`` or ``sha256-<hex>``; raise otherwise."""
    if isinstance(digest, str):
        match = _DIGEST_RE.fullmatch(digest.strip().lower())
        if match:
            return f"sha256:{match.group(1)}"
    raise InvalidDigestError(f"invalid digest {digest!r}: expected sha256:<64 hex digits>")


@dataclass(frozen=True)
class Layer:
    """One content-addressed piece of a model: a GGUF, a template, parameters..."""

    media_type: str
    """What the blob holds (``application/vnd.ollama.image.model`` and friends)."""
    digest: str
    """``sha256:<hex>`` of the blob."""
    size: int
    """Size of the blob in bytes."""
    annotations: tuple[tuple[str, str], ...] = ()
    """OCI annotations (key, value), in order; an adapter layer's scale is one
    (:data:`ANNOTATION_SCALE`). Registries and Ollama ignore them."""

    def annotation(self, key: str) -> str | None:
        """The value of annotation ``key``, if the layer has it."""
        return next((value for name, value in self.annotations if name == key), None)

    def to_json(self) -> dict[str, Any]:
        """The layer as it appears in a manifest."""
        data: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if self.annotations:
            data["annotations"] = dict(self.annotations)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Layer:
        """Validate and build a layer from manifest JSON."""
        if not isinstance(data, dict):
            raise StoreError("malformed manifest: a layer is not an object")
        media_type = data.get("mediaType")
        size = data.get("size")
        if not isinstance(media_type, str) or not media_type:
            raise StoreError("malformed manifest: a layer has no mediaType")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise StoreError("malformed manifest: a layer has no valid size")
        annotations = data.get("annotations") or {}
        if (
            not isinstance(annotations, dict)
            or len(annotations) > _MAX_ANNOTATIONS
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items())
        ):
            raise StoreError("malformed manifest: a layer's annotations are not a small string map")
        return cls(
            media_type=media_type,
            digest=normalize_digest(data.get("digest", "")),
            size=size,
            annotations=tuple(annotations.items()),
        )


@dataclass(frozen=True)
class Manifest:
    """A model: a config blob and its layers."""

    config: Layer
    """The config blob (model format, family, file type)."""
    layers: tuple[Layer, ...] = field(default_factory=tuple)
    """The model's layers in order."""

    def layer(self, media_type: str) -> Layer | None:
        """The first layer of ``media_type``, if any."""
        return next((layer for layer in self.layers if layer.media_type == media_type), None)

    def layers_of(self, media_type: str) -> list[Layer]:
        """Every layer of ``media_type``, in order (a model may have several adapters)."""
        return [layer for layer in self.layers if layer.media_type == media_type]

    @property
    def digests(self) -> set[str]:
        """Every blob the manifest references, config included."""
        return {self.config.digest, *(layer.digest for layer in self.layers)}

    @property
    def size(self) -> int:
        """Bytes of all layers and the config."""
        return self.config.size + sum(layer.size for layer in self.layers)

    def to_bytes(self) -> bytes:
        """Serialised manifest, as written to disk and served by registries."""
        document = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }
        return json.dumps(document, indent=None, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        """Parse and validate a manifest document."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise StoreError("malformed manifest: larger than 1 MiB")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"malformed manifest: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise StoreError("malformed manifest: not a JSON object")
        if data.get("schemaVersion") != 2:
            raise StoreError("malformed manifest: schemaVersion is not 2")
        layers = data.get("layers")
        if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
            raise StoreError("malformed manifest: layers is not a list of at most 256 entries")
        return cls(
            config=Layer.from_json(data.get("config")),
            layers=tuple(Layer.from_json(item) for item in layers),
        )
