"""The daemon's error vocabulary: one exception that carries an HTTP status, and the mapping
from every other error the daemon can meet (store, names, runner) onto it.

Each API renders :class:`HTTPProblem` in its own shape (``{"error": "..."}`` for Ollama,
``{"error": {"message", "type", "param", "code"}}`` for OpenAI); see :mod:`.app`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from localllm._exceptions import (
    AuthRequiredError,
    BlobNotFoundError,
    DamagedModelError,
    DigestMismatchError,
    DiskFullError,
    GGUFError,
    InvalidDigestError,
    InvalidNameError,
    LocalLLMError,
    ModelNotFoundError,
    NetworkError,
    OperationCancelledError,
    PullError,
    QuantizeError,
    RateLimitedError,
    RemoteNotFoundError,
    StoreBusyError,
    StoreError,
    StoreUnwritableError,
)

from .runner.client import RunnerDiedError, RunnerError, RunnerStartError

__all__ = [
    "BUSY_MESSAGE",
    "ClientGone",
    "HTTPProblem",
    "InsufficientMemoryError",
    "QueueFullError",
    "field_path",
    "problem_from",
    "validation_problem",
]

# Ollama's wording, which clients and users already recognise.
BUSY_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"


class HTTPProblem(Exception):
    """An error with the status code and message a client should see."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        """The request field at fault, when there is one (OpenAI's ``param``)."""
        self.code = code
        """A short machine-readable code (OpenAI's ``code``)."""
        self.headers = headers or {}


class QueueFullError(HTTPProblem):
    """The wait queue is full: 503 with ``Retry-After``."""

    def __init__(self) -> None:
        super().__init__(503, BUSY_MESSAGE, code="server_busy", headers={"Retry-After": "1"})


class InsufficientMemoryError(HTTPProblem):
    """A model cannot be loaded in the memory that is free: 507, naming what is needed, what
    is free and what to change (:func:`~localllm.daemon.memory.plan.refusal`)."""

    def __init__(self, message: str) -> None:
        super().__init__(507, message, code="insufficient_memory")


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


def problem_from(exc: BaseException, model: str | None = None) -> HTTPProblem:
    """The :class:`HTTPProblem` a client should see for ``exc`` (never a traceback)."""
    if isinstance(exc, HTTPProblem):
        return exc
    if isinstance(exc, ModelNotFoundError):
        return HTTPProblem(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, InvalidNameError):
        return HTTPProblem(400, str(exc), param="model", code="invalid_model_name")
    if isinstance(exc, DigestMismatchError | InvalidDigestError):
        return HTTPProblem(400, str(exc), param="digest", code="invalid_digest")
    if isinstance(exc, BlobNotFoundError | RemoteNotFoundError):
        return HTTPProblem(404, str(exc), code="not_found")
    if isinstance(exc, DiskFullError):
        return HTTPProblem(507, str(exc), code="disk_full")
    if isinstance(exc, StoreUnwritableError):
        return HTTPProblem(507, str(exc), code="store_unwritable")
    if isinstance(exc, StoreBusyError):
        return HTTPProblem(409, str(exc), code="busy")
    if isinstance(exc, DamagedModelError):
        return HTTPProblem(500, str(exc), param="model", code="model_damaged")
    if isinstance(exc, GGUFError):
        return HTTPProblem(400, f"not a usable GGUF model: {exc}", code="invalid_model")
    if isinstance(exc, RunnerStartError):
        name = f" {model}" if model else ""
        return HTTPProblem(500, f"failed to load model{name}: {exc}", code="load_failed")
    if isinstance(exc, RunnerDiedError):
        name = f" for {model}" if model else ""
        return HTTPProblem(
            500,
            f"the model runner{name} stopped unexpectedly ({exc}); "
            "it will be started again on the next request",
            code="runner_died",
        )
    if isinstance(exc, RunnerError):
        if exc.code == "context_overflow":
            # OpenAI's code, which its clients (and agents that trim history) look for.
            return HTTPProblem(400, str(exc), code="context_length_exceeded")
        status = 400 if exc.code in ("bad_request", "unsupported") else 500
        return HTTPProblem(status, str(exc), code=exc.code)
    if isinstance(exc, AuthRequiredError):
        return HTTPProblem(403, str(exc), code="auth_required")
    if isinstance(exc, RateLimitedError):
        wait = exc.retry_after
        headers = {"Retry-After": str(max(1, round(wait)))} if wait is not None else {}
        return HTTPProblem(429, str(exc), code="rate_limited", headers=headers)
    if isinstance(exc, NetworkError):
        return HTTPProblem(502, str(exc), code="network_error")
    if isinstance(exc, OperationCancelledError):
        return HTTPProblem(499, str(exc), code="cancelled")
    if isinstance(exc, QuantizeError | PullError | StoreError | LocalLLMError):
        return HTTPProblem(400, str(exc), code="bad_request")
    return HTTPProblem(500, "internal error; see the daemon log for details", code="internal")


def field_path(loc: Sequence[Any]) -> str:
    """A validation error's location as a request field (``messages[0].content``)."""
    text = ""
    for part in (str(p) for p in loc if p not in ("body", "query", "path")):
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text


def validation_problem(
    errors: Sequence[Mapping[str, Any]],
    *,
    missing: str = "{field} is required",
    invalid: str = "invalid {field}: {message}",
) -> HTTPProblem:
    """A 400 naming the first field of a request body that failed validation; ``missing``
    and ``invalid`` word it in the API's own way."""
    if not errors:
        return HTTPProblem(400, "invalid request")
    first = errors[0]
    kind = first.get("type", "")
    field = field_path(first.get("loc", ()))
    if kind == "json_invalid":
        return HTTPProblem(400, "the request body is not valid JSON", code="invalid_json")
    if not field:
        if kind == "missing":
            return HTTPProblem(400, "a JSON request body is required", code="missing_body")
        return HTTPProblem(400, f"invalid request body: {first.get('msg', '')}")
    if kind == "missing":
        return HTTPProblem(400, missing.format(field=field), param=field, code="missing_field")
    message = str(first.get("msg", "invalid value"))
    return HTTPProblem(
        400, invalid.format(field=field, message=message), param=field, code="invalid_field"
    )
