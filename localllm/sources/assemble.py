"""Writing a model from blobs that are already in the store.

``create_model`` builds a model from one GGUF blob. A split GGUF has several (one layer per
part, in order), and a quantized model keeps its source's template, system, params, license and
messages layers as they are. Both are written here by letting ``create_model`` validate the
first GGUF and write the config blob, then rewriting the manifest with every layer.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._exceptions import StoreError
from ..manifest import MEDIA_MODEL, MEDIA_PROJECTOR, Layer, Manifest
from ..models import create_model
from ..names import ModelName
from ..store import ModelEntry, Store

__all__ = ["assemble_model"]


def assemble_model(
    store: Store,
    name: ModelName,
    model_layers: Sequence[Layer],
    other_layers: Sequence[Layer] = (),
) -> ModelEntry:
    """Write ``name`` with ``model_layers`` (a GGUF, or a split GGUF's parts) and ``other_layers``.

    Every blob must already be in the store; the first model layer must be a valid GGUF.
    """
    if not model_layers or any(layer.media_type != MEDIA_MODEL for layer in model_layers):
        raise StoreError(f"cannot write {name}: it needs at least one GGUF model layer")
    projectors = [layer for layer in other_layers if layer.media_type == MEDIA_PROJECTOR]
    with store.writing():
        # The projector goes through create_model, which checks it is one (a clip GGUF).
        entry = create_model(
            store,
            name,
            gguf_digest=model_layers[0].digest,
            projector_digest=projectors[0].digest if projectors else None,
        )
        if len(model_layers) == 1 and len(other_layers) == len(projectors) <= 1:
            return entry
        extra = [layer for layer in other_layers if layer.media_type != MEDIA_MODEL]
        manifest = Manifest(config=entry.manifest.config, layers=(*model_layers, *extra))
        store.write_manifest(name, manifest)
        # Read back under the lock: a concurrent pull of the same name rewrites it meanwhile.
        return store.get(name)
