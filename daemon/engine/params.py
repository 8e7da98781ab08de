"""What the model and the RPC split share below them: the error a refused load raises, and
a checked setter for llama.cpp's parameter structs."""

from __future__ import annotations

import ctypes

__all__ = ["ModelLoadError", "set_fields"]


class ModelLoadError(RuntimeError):
    """llama.cpp refused to load the model or create its context."""


def set_fields(params: ctypes.Structure, **values: object) -> None:
    """Set fields of a llama.cpp parameter struct, refusing a name the struct lacks.

    ctypes accepts any attribute on a struct, so a field llama.cpp renamed (``use_mmap``
    became ``load_mode``) would otherwise be dropped without a word.
    """
    fields = {name for name, *_ in type(params)._fields_}
    for name, value in values.items():
        if name not in fields:
            raise AttributeError(f"this llama.cpp has no {type(params).__name__}.{name}")
        setattr(params, name, value)
