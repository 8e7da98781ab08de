"""The manifest of a model whose blobs are already in the store.

``build_manifest`` builds a model from one GGUF blob. A split GGUF has several (one layer per
part, in order), and a model pulled with extra layers keeps them as they are. Both are built
here by letting ``build_manifest`` validate the first GGUF (and the projector) and write the
config blob, then listing every layer. Nothing is named here: the caller's transaction writes
the manifest, last.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._exceptions import StoreError
from ..store.manifest import MEDIA_MODEL, MEDIA_PROJECTOR, Layer, Manifest
from ..store.models import build_manifest
from ..store.store import Store

__all__ = ["assemble_manifest"]


def assemble_manifest(
    store: Store,
    model_layers: Sequence[Layer],
    other_layers: Sequence[Layer] = (),
) -> Manifest:
    """The manifest of ``model_layers`` (a GGUF, or a split GGUF's parts) and ``other_layers``.

    Every blob must already be in the store; the first model layer must be a valid GGUF.
    """
    if not model_layers or any(layer.media_type != MEDIA_MODEL for layer in model_layers):
        raise StoreError("a model needs at least one GGUF model layer")
    projectors = [layer for layer in other_layers if layer.media_type == MEDIA_PROJECTOR]
    # The projector goes through build_manifest, which checks it is one (a clip GGUF).
    manifest = build_manifest(
        store,
        gguf_digest=model_layers[0].digest,
        projector_digest=projectors[0].digest if projectors else None,
    )
    if len(model_layers) == 1 and len(other_layers) == len(projectors) <= 1:
        return manifest
    extra = [layer for layer in other_layers if layer.media_type != MEDIA_MODEL]
    return Manifest(config=manifest.config, layers=(*model_layers, *extra))
