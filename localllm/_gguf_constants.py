"""gguf's constants (value, quantization and file types, block sizes) without the rest of the
``gguf`` package.

``import gguf`` runs its whole package, which imports numpy, sentencepiece and yaml: about
0.12 s of every daemon start, paid only to read a GGUF header's enums. ``gguf/constants.py``
imports nothing but the standard library, so it is loaded from the installed package on its
own, under a private name (never as ``gguf.constants``: a later ``import gguf`` then runs as it
always does). Its enums are IntEnums, so they equal and hash as gguf's own members of the same
value do; only ``is`` tells them apart.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

__all__ = ["gguf_constants"]

_NAME = "localllm._gguf_constants_module"


@cache
def gguf_constants() -> ModuleType:
    """The installed gguf package's ``constants`` module, loaded without the package."""
    package = importlib.util.find_spec("gguf")
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    location = Path(next(iter(package.submodule_search_locations))) / "constants.py"
    spec = importlib.util.spec_from_file_location(_NAME, location)
    if spec is None or spec.loader is None:
        raise ImportError(f"gguf's constants cannot be loaded from {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # dataclasses and enums look their module up by name
    spec.loader.exec_module(module)
    return module
