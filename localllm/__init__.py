"""localllm: run large language models locally — pull, quantize, serve and chat.

The core package holds names, settings, the model store, GGUF inspection, model sources and the
HTTP client. The daemon (``localllm.daemon``) and the terminal UI (``localllm.tui``) build on it.
"""

from __future__ import annotations

from ._exceptions import (
    APIError,
    AuthRequiredError,
    BlobNotFoundError,
    DaemonError,
    DaemonTimeoutError,
    DaemonUnavailableError,
    DigestMismatchError,
    DiskFullError,
    GGUFError,
    InvalidDigestError,
    InvalidNameError,
    LaunchError,
    LocalLLMError,
    ModelNotFoundError,
    NetworkError,
    OperationCancelledError,
    PullError,
    QuantizeError,
    RemoteNotFoundError,
    SettingsError,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "AuthRequiredError",
    "BlobNotFoundError",
    "DaemonError",
    "DaemonTimeoutError",
    "DaemonUnavailableError",
    "DigestMismatchError",
    "DiskFullError",
    "GGUFError",
    "InvalidDigestError",
    "InvalidNameError",
    "LaunchError",
    "LocalLLMError",
    "ModelNotFoundError",
    "NetworkError",
    "OperationCancelledError",
    "PullError",
    "QuantizeError",
    "RemoteNotFoundError",
    "SettingsError",
    "StoreError",
    "__version__",
]
