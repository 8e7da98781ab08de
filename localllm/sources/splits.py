"""Split GGUF models in the store, and how to hand them to llama.cpp.

A split model (``<prefix>-00001-of-00003.gguf``...) is stored as it was published: one blob per
part, each a ``application/vnd.ollama.image.model`` layer, in part order. Nothing is merged, so
every part keeps the sha256 the Hub published for it and resuming works part by part.

llama.cpp loads such a model from

* the list of part paths: ``llama_model_load_from_splits(paths, n_paths, params)`` (what the
  runner should call with :func:`model_paths`), or
* the first part, when the others sit beside it under the names llama.cpp derives from it:
  :func:`linked_splits` makes such names (symbolic links to the blobs) in a temporary folder,
  for APIs that take one path (``llama_model_quantize``, ``llama_cpp.Llama``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from .._exceptions import StoreError
from ..store.manifest import MEDIA_MODEL, Manifest
from ..store.store import Store

__all__ = ["linked_splits", "model_paths"]


def model_paths(store: Store, manifest: Manifest) -> list[Path]:
    """Blob paths of the model's GGUF: one path, or every part of a split model in order."""
    paths = [
        store.blob_path(layer.digest)
        for layer in manifest.layers
        if layer.media_type == MEDIA_MODEL
    ]
    if not paths:
        raise StoreError("the model has no GGUF layer")
    return paths


@contextlib.contextmanager
def linked_splits(paths: Sequence[Path]) -> Iterator[Path]:
    """One path llama.cpp can open for the model made of ``paths``.

    A single file is yielded as it is. For a split model, the parts are linked as
    ``model-0000i-of-0000n.gguf`` in a temporary folder (removed afterwards) and the first
    link is yielded.
    """
    if len(paths) == 1:
        yield Path(paths[0])
        return
    count = len(paths)
    with tempfile.TemporaryDirectory(prefix="localllm-splits-") as folder:
        links = [
            Path(folder) / f"model-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1)
        ]
        for link, path in zip(links, paths, strict=True):
            os.symlink(Path(path).resolve(), link)
        yield links[0]
