"""Errors in each API family's shape, and the route class that renders a router's errors.

Ollama's routes answer ``{"error": "..."}``; OpenAI's (chat, completions, embeddings, models,
Responses) ``{"error": {"message", "type", "param", "code"}}``; Anthropic's ``{"type":
"error", "error": {"type", "message"}}`` with its own status codes (529 for a full queue).
Two families (OpenAI's two APIs) share the OpenAI shape, and two (Anthropic, Responses) need
their router's errors rendered by a route class, so these live here rather than in any
family module.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ClientGone, HTTPProblem, field_path, problem_from, validation_problem

__all__ = [
    "anthropic_error",
    "error_route",
    "openai_error",
    "strict_problem",
]

log = logging.getLogger("localllm.daemon")

_OVERFLOW_PARAM = {
    "chat/completions": "messages",
    "completions": "prompt",
    "embeddings": "input",
    "responses": "input",
}

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented",
    503: "server_busy",
}


def openai_error(problem: HTTPProblem, path: str = "") -> dict[str, Any]:
    """OpenAI's error object for ``problem`` on the route at ``path``.

    A prompt over the context is OpenAI's ``context_length_exceeded`` (what its clients and
    agents that trim history look for), naming the request field that holds the prompt."""
    code, param = problem.code, problem.param
    if code in ("context_overflow", "context_length_exceeded"):
        code = "context_length_exceeded"
        route = path.removeprefix("/v1").strip("/")
        param = param or _OVERFLOW_PARAM.get(route)
    return {
        "error": {
            "message": problem.message,
            "type": _OPENAI_TYPES.get(problem.status, "api_error"),
            "param": param,
            "code": code,
        }
    }


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}

_OVERFLOW = re.compile(r"(\d+) tokens, more than fit in this model's context of (\d+)")


def anthropic_error(problem: HTTPProblem) -> tuple[int, dict[str, Any]]:
    """(status, body) of ``problem`` as Anthropic's API answers it: a full queue is 529
    ``overloaded_error``, a prompt over the context its "prompt is too long" wording (which
    Claude Code looks for to compact the conversation)."""
    status = 529 if problem.status == 503 else problem.status
    message = problem.message
    if problem.code in ("context_length_exceeded", "context_overflow"):
        found = _OVERFLOW.search(message)
        if found:
            message = f"prompt is too long: {found[1]} tokens > {found[2]} maximum ({message})"
    kind = _ANTHROPIC_TYPES.get(
        status, "invalid_request_error" if 400 <= status < 500 else "api_error"
    )
    body = {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": f"req_{secrets.token_hex(12)}",
    }
    return status, body


def strict_problem(exc: RequestValidationError) -> HTTPProblem:
    """A 400 for a request body that failed validation, naming the field; unknown fields
    are named together (no parameter is silently ignored, so they are refused)."""
    errors = list(exc.errors())
    unknown = [field_path(e.get("loc", ())) for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        return HTTPProblem(
            400,
            f"unknown field{plural} {', '.join(unknown)}: not supported by localllm "
            "(remove it; no parameter is silently ignored)",
            param=unknown[0],
            code="unknown_field",
        )
    # Anthropic's wording, which its clients show as they get it.
    return validation_problem(
        errors, missing="{field}: Field required", invalid="{field}: {message}"
    )


Renderer = Callable[[Request, HTTPProblem], Response]


def error_route(render: Renderer) -> type[APIRoute]:
    """A route class whose errors (bad bodies included, read by :func:`strict_problem`) are
    answered by ``render`` in the API's own shape; the app-wide handlers would answer in
    OpenAI's shape under ``/v1``."""

    class _Route(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    return await handler(request)
                except ClientGone:
                    raise  # no one to answer; the app logs a 499
                except RequestValidationError as exc:
                    return render(request, strict_problem(exc))
                except HTTPProblem as exc:
                    return render(request, exc)
                except StarletteHTTPException as exc:  # FastAPI's own 4xx (a body not JSON)
                    detail = exc.detail if isinstance(exc.detail, str) else "bad request"
                    return render(request, HTTPProblem(exc.status_code, detail))
                except Exception as exc:
                    problem = problem_from(exc)
                    if problem.status >= 500 and problem.code == "internal":
                        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
                    return render(request, problem)

            return route

    return _Route
