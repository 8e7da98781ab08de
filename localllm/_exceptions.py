"""Every error localllm raises on purpose.

The hierarchy, so callers can catch exactly what they can handle::

    LocalLLMError                  base of all below; ``str(err)`` is a one-line message for people
    ├── SettingsError              a LOCALLLM_* variable holds a value that cannot be used
    ├── InvalidNameError           a model name breaks the grammar or could escape the store
    ├── ModelNotFoundError         a valid name that the store does not hold
    ├── StoreError                 the model store cannot do what was asked
    │   ├── DigestMismatchError    bytes whose sha256 is not the digest they were promised under
    │   ├── InvalidDigestError     a string that is not ``sha256:<64 hex>`` / ``sha256-<64 hex>``
    │   ├── BlobNotFoundError      a digest with no blob behind it
    │   ├── DiskFullError          the disk filled up while writing; what the change wrote is gone
    │   ├── StoreUnwritableError   the store's folder is read-only, missing or not ours to write
    │   ├── StoreBusyError         another change of the same model name is in progress
    │   └── DamagedModelError      a model whose blob is missing or does not match its digest
    ├── GGUFError                  a file that is not a usable GGUF (not GGUF, truncated, absurd)
    ├── QuantizeError              llama.cpp could not quantize a model
    ├── ConvertError               a safetensors folder that cannot be converted to GGUF
    │   ├── NotAFolderError        the path is not a folder
    │   ├── MissingConfigError     no config.json (or one that is not a JSON object)
    │   ├── UnsupportedArchitectureError  an architecture the converter has no family for
    │   ├── MissingTokenizerError  neither tokenizer.json nor tokenizer.model
    │   ├── MissingShardError      a shard named by the index, or any weights at all, missing
    │   ├── TruncatedShardError    a shard shorter than its header says (or a broken header)
    │   ├── TensorMismatchError    a tensor whose shape or dtype disagrees with the config
    │   └── PickleCheckpointError  only pickled weights (pytorch_model.bin, *.pt): never unpickled
    ├── PullError                  a model could not be downloaded or looked up at its source
    │   ├── RemoteNotFoundError    the repository, model, tag or file does not exist upstream
    │   ├── AuthRequiredError      the source wants credentials we do not have
    │   └── NetworkError           the source could not be reached
    │       └── RateLimitedError   the source refuses for now (HTTP 429); ``retry_after`` seconds
    ├── OperationCancelledError    the caller cancelled a pull or a quantization (its cancel event)
    ├── BenchError                 a benchmark that cannot run as asked (``localllm bench``)
    ├── LaunchError                ``localllm launch`` cannot set up or start a coding tool
    ├── ToolServerError            an MCP server cannot be started or used (``run``, the TUI)
    │   └── ToolConfigError        the MCP config file (``mcp.json``) or an entry in it is wrong
    └── DaemonError                talking to the daemon failed
        ├── DaemonUnavailableError no daemon answers and none could be started
        │   └── DaemonTimeoutError  the daemon did not answer in time
        └── APIError               the daemon answered with an error status (``status_code``)

Messages are written for the person at the terminal: say what is wrong and what to do.
"""

from __future__ import annotations

__all__ = [
    "APIError",
    "AdapterError",
    "AuthRequiredError",
    "BenchError",
    "BlobNotFoundError",
    "ConvertError",
    "DaemonError",
    "DaemonTimeoutError",
    "DaemonUnavailableError",
    "DamagedModelError",
    "DigestMismatchError",
    "DiskFullError",
    "GGUFError",
    "InvalidDigestError",
    "InvalidNameError",
    "LaunchError",
    "LocalLLMError",
    "MissingConfigError",
    "MissingShardError",
    "MissingTokenizerError",
    "ModelNotFoundError",
    "NetworkError",
    "NotAFolderError",
    "OperationCancelledError",
    "PickleCheckpointError",
    "PullError",
    "QuantizeError",
    "RateLimitedError",
    "RemoteNotFoundError",
    "SettingsError",
    "StoreBusyError",
    "StoreError",
    "StoreUnwritableError",
    "TensorMismatchError",
    "ToolConfigError",
    "ToolServerError",
    "TruncatedShardError",
    "UnsupportedArchitectureError",
]


class LocalLLMError(Exception):
    """Base class of every error localllm raises deliberately."""


class SettingsError(LocalLLMError):
    """A ``LOCALLLM_*`` environment variable holds a value that cannot be used."""


class InvalidNameError(LocalLLMError, ValueError):
    """A model name that breaks the name grammar or could reach outside the store."""


class ModelNotFoundError(LocalLLMError, LookupError):
    """A well-formed model name that the store does not hold."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f'model "{name}" not found, try `localllm pull {name}`')


class StoreError(LocalLLMError):
    """The model store cannot do what was asked."""


class DigestMismatchError(StoreError):
    """Bytes whose sha256 differs from the digest they were expected to have."""

    def __init__(self, expected: str, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"digest mismatch: expected {expected}, got {actual}")


class InvalidDigestError(StoreError, ValueError):
    """A digest string that is not ``sha256:`` (or ``sha256-``) followed by 64 hex digits."""


class BlobNotFoundError(StoreError, LookupError):
    """A digest with no blob behind it in the store."""


class DiskFullError(StoreError, OSError):
    """The disk filled up during a write; what the change wrote was removed (a pull keeps its
    resumable download and says so)."""


class StoreUnwritableError(StoreError):
    """The store's folder cannot be written (read-only, missing, permission denied)."""


class StoreBusyError(StoreError):
    """Another create, copy, pull or delete of the same model name is in progress."""


class DamagedModelError(StoreError):
    """A model whose blob is missing, has the wrong size or does not match its digest: it is
    never served; the message names it and the fix."""

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem
        super().__init__(
            f"model {name} is damaged: {problem}; remove it with `localllm rm {name}` and pull "
            "or create it again"
        )


class GGUFError(LocalLLMError):
    """A file that is not a usable GGUF model: wrong magic, truncated, or absurd sizes."""


class AdapterError(LocalLLMError):
    """A LoRA adapter that cannot be applied to its base model: not a GGUF adapter (a
    safetensors/PEFT one to convert first), another architecture, or a tensor that does not
    fit the base's."""


class QuantizeError(LocalLLMError):
    """llama.cpp could not quantize a model, or the request cannot be quantized."""


class ConvertError(LocalLLMError):
    """A safetensors folder (a model as the Hub ships it) that cannot be converted to GGUF.

    Every subclass is bad input: the daemon answers it with HTTP 400, and nothing half-written
    is left behind (the converter writes to a temporary name and removes it on error).
    """


class NotAFolderError(ConvertError):
    """The path given to the converter does not exist or is not a folder."""


class MissingConfigError(ConvertError):
    """The folder has no ``config.json``, or one that is not a JSON object."""


class UnsupportedArchitectureError(ConvertError):
    """``config.json`` names an architecture the converter has no family for."""

    def __init__(self, architecture: str, supported: tuple[str, ...]) -> None:
        self.architecture = architecture
        self.supported = supported
        super().__init__(
            f"cannot convert architecture {architecture!r}: supported are " + ", ".join(supported)
        )


class MissingTokenizerError(ConvertError):
    """The folder has neither ``tokenizer.json`` nor ``tokenizer.model`` (or one unusable)."""


class MissingShardError(ConvertError):
    """A weights file that the index names (or any ``*.safetensors`` at all) is missing."""


class TruncatedShardError(ConvertError):
    """A safetensors file shorter than its header says, or whose header cannot be read."""


class TensorMismatchError(ConvertError):
    """A tensor whose shape or dtype disagrees with what ``config.json`` implies, a tensor
    missing, or one the family does not know."""


class PickleCheckpointError(ConvertError):
    """Only pickled weights (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``): loading them would
    run code from the file, so they are refused and never unpickled."""


class PullError(LocalLLMError):
    """A model could not be downloaded, or looked up at its source (search, file lists)."""


class RemoteNotFoundError(PullError, LookupError):
    """The repository, model, tag or file does not exist at the source."""


class AuthRequiredError(PullError):
    """The source wants credentials (a token) that were not given or were refused."""


class NetworkError(PullError, ConnectionError):
    """The source could not be reached or the connection kept failing."""


class RateLimitedError(NetworkError):
    """The source answered HTTP 429: too many requests for now."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        """Seconds to wait before asking again, when the source said (else ``None``)."""


class OperationCancelledError(LocalLLMError):
    """The caller set the cancel event of a pull or quantization; partial downloads are kept."""


class BenchError(LocalLLMError):
    """A benchmark that cannot run as asked (a bad option, an unknown compare key...)."""


class LaunchError(LocalLLMError):
    """``localllm launch`` cannot set up or start a coding tool (not installed, a config file
    it cannot read, no model that fits...)."""


class ToolServerError(LocalLLMError):
    """An MCP server (a tool server of the chat) cannot be started or used: its command fails,
    it exits, it does not answer in time."""


class ToolConfigError(ToolServerError):
    """The MCP config file (``mcp.json``, the ``mcpServers`` shape) cannot be read or holds an
    entry that cannot be used; the message names the file and the server."""


class DaemonError(LocalLLMError):
    """Talking to the localllm daemon failed."""


class DaemonUnavailableError(DaemonError, ConnectionError):
    """No daemon answers on the configured address and none could be started."""


class DaemonTimeoutError(DaemonUnavailableError, TimeoutError):
    """The daemon accepted the connection but did not answer (or take the request) in time."""


class APIError(DaemonError):
    """The daemon answered a request with an error status."""

    def __init__(self, status_code: int, message: str) -> None:
        self.status_code = status_code
        self.message = message
        super().__init__(message)
