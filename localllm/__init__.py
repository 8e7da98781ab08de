"""localllm: run large language models locally — pull, quantize, serve and chat.

The core package holds names, settings, the model store, GGUF inspection, model sources and the
HTTP client. The daemon (``localllm.daemon``) and the terminal UI (``localllm.tui``) build on it.
"""

from __future__ import annotations

from . import _exceptions
from ._exceptions import *  # noqa: F403 (every error: _exceptions.__all__)

__version__ = "0.1.0"

__all__ = ["__version__"]
__all__ += _exceptions.__all__
