"""The FastAPI application: routes of both API families, error rendering, middleware.

Errors take the shape of the API they belong to: ``{"error": "..."}`` under ``/api`` and
``/``, OpenAI's ``{"error": {"message", "type", "param", "code"}}`` on the OpenAI routes (under
``/v1`` and their bare aliases). Bad input is always a 4xx naming the field; anything
unexpected is logged with its traceback and answered with a plain 500 message (the traceback
never reaches a client).

Request bodies are JSON whatever their ``Content-Type`` says, as Ollama and llama-server read
them: ``curl -d`` sends ``application/x-www-form-urlencoded`` and litellm sends none.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localllm import __version__
from localllm._exceptions import LocalLLMError
from localllm.settings import Settings

from .api import (
    anthropic,
    discover,
    fleet,
    llamaserver,
    memory,
    ollama,
    openai,
    rerank,
    responses,
)
from .api.errorshapes import openai_error
from .api.hotroutes import HotRoutes
from .errors import ClientGone, HTTPProblem, problem_from, validation_problem
from .firsttoken import ARRIVAL
from .runner.client import RunnerError
from .security import GuardMiddleware, is_openai_path, origin_regex
from .state import DaemonState

__all__ = ["ACCESS_LOG", "create_app"]

log = logging.getLogger("localllm.daemon")


def _render(request: Request, problem: HTTPProblem) -> Response:
    path = request.url.path
    if is_openai_path(path):
        body: dict[str, Any] = openai_error(problem, path)
    else:
        body = {"error": problem.message}
    return JSONResponse(body, status_code=problem.status, headers=problem.headers)


def _validation_problem(exc: RequestValidationError) -> HTTPProblem:
    return validation_problem(exc.errors())


_JSON_TYPE = (b"content-type", b"application/json")


def _is_json_type(value: bytes) -> bool:
    kind = value.split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or kind.endswith(b"+json")


class _JsonBodies:
    """Every request body is read as JSON, whatever its ``Content-Type`` says.

    Ollama and llama-server do the same, and clients rely on it: ``curl -d`` labels its body
    a form, litellm sends no type. Rewriting the header once here means every route (and its
    "not valid JSON" 400) treats them alike. Blob uploads (``/api/blobs/``) are raw bytes and
    keep their header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("path", "").startswith("/api/blobs/"):
            headers = scope["headers"]
            current = [v for k, v in headers if k.lower() == b"content-type"]
            if not current or not _is_json_type(current[0]):
                kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
                scope = {**scope, "headers": [*kept, _JSON_TYPE]}
        await self.app(scope, receive, send)


class _Arrival:
    """Stamps each request's arrival in its scope (:data:`~.firsttoken.ARRIVAL`), where the
    time to its first token starts, unless the HTTP protocol did as it parsed the request's
    first bytes (:mod:`.httphead`). The outermost of the app's layers, so each of them counts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if ARRIVAL not in scope:
            scope[ARRIVAL] = time.perf_counter_ns()
        await self.app(scope, receive, send)


ACCESS_LOG = logging.Logger("uvicorn.access")
"""The logger of each answer's access line: uvicorn's line under uvicorn's logger name, but
the app's own logger (outside the logging registry), which :func:`~.server.setup_logging`
sends to ``daemon.log``. uvicorn's own (``logging.getLogger("uvicorn.access")``) has no
handler in the daemon (``access_log=False``), so uvicorn writes none."""


class _CountRequests:
    """Counts answered HTTP requests by route and status for /metrics, and writes each one's
    access line (uvicorn's, word for word) once its answer is over.

    uvicorn writes that line as the headers go out, which for a stream is the moment of its
    first token: the record formatted then, and the log's writer thread woken to contend for
    the GIL and the cores while the first token's bytes are written. Written at the end, the
    line is the same and the first token does not wait for it."""

    def __init__(self, app: ASGIApp, state: DaemonState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the server answers when the app fails before its own answer

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
            if ACCESS_LOG.handlers and ACCESS_LOG.isEnabledFor(logging.INFO):
                ACCESS_LOG.info(
                    '%s - "%s %s HTTP/%s" %d',
                    _client(scope),
                    scope["method"],
                    _path_and_query(scope),
                    scope["http_version"],
                    status,
                )


def _client(scope: Scope) -> str:
    """The client's address as uvicorn's access line writes it (empty on the Unix socket)."""
    client = scope.get("client")
    if not client:
        return ""
    host, port = client
    return f"{host}:{port}"


def _path_and_query(scope: Scope) -> str:
    """The path and query as uvicorn's access line writes it."""
    raw = scope.get("raw_path")
    path = raw.decode("latin1") if raw is not None else scope["path"]
    if scope.get("query_string"):
        path = f"{path}?{scope['query_string'].decode('ascii')}"
    return path.replace('"', "%22")


def _model_routes(app: FastAPI) -> None:
    """``GET /v1/models`` and ``/v1/models/{id}`` answer in Anthropic's shape to a client
    that sends ``anthropic-version`` (Anthropic's SDK always does), in OpenAI's otherwise:
    both APIs own the path. Registered before the routers, so they come first."""

    @app.get("/v1/models", include_in_schema=False)
    async def models(request: Request) -> Response:
        state = request.app.state.daemon
        if "anthropic-version" in request.headers:
            return await anthropic.list_models(request, state)
        return JSONResponse(await openai.list_models(state))

    @app.get("/v1/models/{model_id:path}", include_in_schema=False)
    async def model(request: Request, model_id: str) -> Response:
        state = request.app.state.daemon
        if "anthropic-version" in request.headers:
            return await anthropic.get_model(request, state, model_id)
        return JSONResponse(await openai.get_model(model_id, state))


def _post_route(router: Any, path: str) -> APIRoute:
    """The POST route of ``router`` at ``path`` (the router's own path, before a prefix)."""
    for route in router.routes:
        if isinstance(route, APIRoute) and route.path == path and "POST" in route.methods:
            return route
    raise LookupError(f"no POST {path}")


def _hot_routes() -> dict[str, APIRoute]:
    """The generation routes whose valid requests skip FastAPI's per-request machinery
    (:mod:`.api.hotroutes`), by the path a client asks for; each path is served by this
    route alone (no other router matches it)."""
    chat = _post_route(openai.router, "/chat/completions")
    completions = _post_route(openai.router, "/completions")
    return {
        "/v1/chat/completions": chat,
        "/chat/completions": chat,
        "/v1/completions": completions,
        "/completions": completions,
        "/api/chat": _post_route(ollama.router, "/api/chat"),
        "/api/generate": _post_route(ollama.router, "/api/generate"),
    }


class _App(FastAPI):
    """FastAPI with :class:`~.api.hotroutes.HotRoutes` in front of its router, inside the
    middlewares and the exception handlers (where FastAPI puts the router)."""

    def build_middleware_stack(self) -> ASGIApp:
        """FastAPI's stack, built around the hot routes instead of the bare router."""
        router = self.router
        # FastAPI builds its stack around ``self.router``; the stand-in is there only while
        # it builds (everything else, the routes and the OpenAPI schema, reads the router).
        self.router = HotRoutes(router, _hot_routes())  # type: ignore[assignment]
        try:
            return super().build_middleware_stack()
        finally:
            self.router = router


def create_app(settings: Settings, state: DaemonState | None = None) -> FastAPI:
    """The daemon's ASGI app for ``settings`` (runners start on first use, not here)."""
    app = _App(
        title="localllm",
        version=__version__,
        description="Ollama- and OpenAI-compatible API of the localllm daemon.",
        docs_url=None,  # the interactive docs load scripts from a CDN; nothing remote here
        redoc_url=None,
    )
    app.state.daemon = state or DaemonState.create(settings)
    _model_routes(app)
    # Routes are matched in order, each router's one by one (a regular expression each): the
    # /v1 routers first, since the Ollama router takes 60 us to turn a /v1 path away, where a
    # /v1 router turns /api/chat away in 3 us. No path is served by two of them.
    app.include_router(openai.router, prefix="/v1")
    app.include_router(anthropic.router, prefix="/v1")
    app.include_router(responses.router, prefix="/v1")
    app.include_router(ollama.router)
    app.include_router(memory.router)
    # the Hugging Face Hub seen from this machine: search, quantizations, fit and speed
    app.include_router(discover.router)
    # llama-server serves the OpenAI routes at the root too; clients given a bare base URL
    # (http://127.0.0.1:11435) call /chat/completions.
    app.include_router(openai.router, include_in_schema=False)
    # llama-server's /tokenize, /detokenize and /infill, for plugins written against it
    app.include_router(llamaserver.router)
    # the load figures a gateway in front of many daemons polls (localllm gateway)
    app.include_router(fleet.router, prefix="/v1")
    # reranking in Jina's and Cohere's shape, under /v1 and (as llama-server) at the root
    app.include_router(rerank.router, prefix="/v1")
    app.include_router(rerank.router)

    @app.get("/health", summary="Liveness (llama-server's shape)")
    @app.get("/v1/health", include_in_schema=False)
    async def health() -> dict[str, str]:
        """``{"status": "ok"}`` while the daemon serves (no API key needed, as in
        llama-server). Models load on demand, so there is no loading state to report here;
        ``/api/ps`` lists what is loaded."""
        return {"status": "ok"}

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

    app.add_middleware(_JsonBodies)
    app.add_middleware(
        CORSMiddleware,
        allow_origin_regex=origin_regex(settings.origins),
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["*"],
    )
    app.add_middleware(_CountRequests, state=app.state.daemon)
    app.add_middleware(GuardMiddleware, settings=settings)
    app.add_middleware(_Arrival)
    return app
