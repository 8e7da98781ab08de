"""The FastAPI application: routes of both API families, error rendering, middleware.

Errors take the shape of the API they belong to: ``{"error": "..."}`` under ``/api`` and
``/``, OpenAI's ``{"error": {"message", "type", "param", "code"}}`` under ``/v1``. Bad input is
always a 4xx naming the field; anything unexpected is logged with its traceback and answered
with a plain 500 message (the traceback never reaches a client).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localllm import __version__
from localllm._exceptions import LocalLLMError
from localllm.settings import Settings

from .api import ollama, openai
from .errors import ClientGone, HTTPProblem, problem_from
from .runner.client import RunnerError
from .security import GuardMiddleware, origin_regex
from .state import DaemonState

__all__ = ["create_app"]

log = logging.getLogger("localllm.daemon")


def _render(request: Request, problem: HTTPProblem) -> Response:
    if request.url.path.startswith("/v1"):
        body: dict[str, Any] = openai.error_body(problem)
    else:
        body = {"error": problem.message}
    return JSONResponse(body, status_code=problem.status, headers=problem.headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    text = ""
    for part in parts:
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text


def _validation_problem(exc: RequestValidationError) -> HTTPProblem:
    errors = exc.errors()
    if not errors:
        return HTTPProblem(400, "invalid request")
    first = errors[0]
    kind = first.get("type", "")
    field = _field(first.get("loc", ()))
    if kind == "json_invalid":
        return HTTPProblem(400, "the request body is not valid JSON", code="invalid_json")
    if not field:
        if kind == "missing":
            return HTTPProblem(400, "a JSON request body is required", code="missing_body")
        return HTTPProblem(400, f"invalid request body: {first.get('msg', '')}")
    if kind == "missing":
        return HTTPProblem(400, f"{field} is required", param=field, code="missing_field")
    message = str(first.get("msg", "invalid value"))
    return HTTPProblem(400, f"invalid {field}: {message}", param=field, code="invalid_field")


class _CountRequests:
    """Counts answered HTTP requests by route and status for /metrics."""

    def __init__(self, app: ASGIApp, state: DaemonState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            self.state.metrics.http_requests.labels(scope["method"], path, str(status)).inc()


def create_app(settings: Settings, state: DaemonState | None = None) -> FastAPI:
    """The daemon's ASGI app for ``settings`` (runners start on first use, not here)."""
    app = FastAPI(
        title="localllm",
        version=__version__,
        description="Ollama- and OpenAI-compatible API of the localllm daemon.",
        docs_url=None,  # the interactive docs load scripts from a CDN; nothing remote here
        redoc_url=None,
    )
    app.state.daemon = state or DaemonState.create(settings)
    app.include_router(ollama.router)
    app.include_router(openai.router)

    @app.exception_handler(HTTPProblem)
    async def _problem(request: Request, exc: HTTPProblem) -> Response:
        return _render(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return _render(request, _validation_problem(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return _render(request, HTTPProblem(exc.status_code, message, headers=exc.headers))

    @app.exception_handler(LocalLLMError)
    async def _local(request: Request, exc: LocalLLMError) -> Response:
        return _render(request, problem_from(exc))

    @app.exception_handler(RunnerError)
    async def _runner(request: Request, exc: RunnerError) -> Response:
        return _render(request, problem_from(exc))

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _render(request, problem_from(exc))

    app.add_middleware(
        CORSMiddleware,
        allow_origin_regex=origin_regex(settings.origins),
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["*"],
    )
    app.add_middleware(_CountRequests, state=app.state.daemon)
    app.add_middleware(GuardMiddleware, settings=settings)
    return app
