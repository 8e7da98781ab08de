"""How models arrive: pulling from Hugging Face and Ollama-protocol registries.

The API the daemon and the CLI use::

    from localllm.sources import pull, PullProgress

    entry = pull(store, "hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0", settings,
                 on_progress=lambda event: print(event.to_json()), cancel=threading.Event())

Modules, one job each:

* :mod:`.pull` — :func:`pull`, the entry point (dispatch by name, checks, manifest writing);
* :mod:`.progress` — :class:`PullProgress`, the ``/api/pull`` NDJSON event;
* :mod:`.huggingface` and :mod:`.gguf_files` — the Hub source and which file a tag means;
* :mod:`.registry` — the Ollama registry protocol (manifests, blobs, bearer tokens);
* :mod:`.transfer` — the resumable, verified, shared download engine both sources use;
* :mod:`.splits` — split GGUF models: their blob paths, and names llama.cpp can open;
* :mod:`.assemble`, :mod:`.blobfile`, :mod:`.plan`, :mod:`.http` — the small pieces between.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .progress import ProgressCallback, PullProgress
    from .pull import pull
    from .splits import linked_splits, model_paths

__all__ = ["ProgressCallback", "PullProgress", "linked_splits", "model_paths", "pull"]

# Imported on first use: a submodule (the hub's listings, say) is imported without the pull
# machinery, which brings httpx, and httpx brings rich and pygments for its command line
# whenever they are installed (0.1 s of every daemon start).
_HOMES = {
    "ProgressCallback": ".progress",
    "PullProgress": ".progress",
    "pull": ".pull",
    "linked_splits": ".splits",
    "model_paths": ".splits",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
