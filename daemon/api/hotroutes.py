"""The generation routes' requests handed to their endpoint without FastAPI's per-request
machinery, when the body is valid; everything else goes the usual way.

A generation request's first token waits for the way from the HTTP server to its endpoint.
FastAPI walks its routes, builds the request handler's context (two exit stacks, telemetry,
the endpoint's description), parses the content type with ``email.message``, and solves the
dependencies generically: cheap on a warm process, but the daemon's process sleeps between a
person's messages, and after such a gap, with the caches cold, that way took 0.45 ms to the
endpoint against 0.24 ms through this one (an in-process timing with 20 ms between
requests). :class:`HotRoutes` sits where FastAPI's router does (inside the middlewares and
the exception handlers) and serves a request to one of the routes given it (an exact path
and POST) itself: the body read through Starlette's :class:`~starlette.requests.Request`
as FastAPI reads it, decoded, validated by the route's body model, and the endpoint called
with it, the request and the daemon's state, as FastAPI would call it; its response, and
whatever it raises, go on as from FastAPI.

A body that is not valid (not JSON, nested too deeply to decode, missing, failing the model)
is handed to FastAPI's own route with the body it read: its error answer stays FastAPI's,
word for word. Only a route whose parameters are exactly a body model, the request and the
state dependency, whose route class is FastAPI's own (a family's route class may render
errors its own way) and which returns a response is served here (:func:`hot_route`); any
other is left to FastAPI.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..state import get_state

__all__ = ["HotRoutes", "hot_route"]

# Starlette's body limit marks a request with this scope key (FastAPI's AppBodyLimitMiddleware,
# when an app or router sets ``max_body_size``); such a request goes FastAPI's way, which
# reports an oversized body as the limit's error.
_BODY_LIMIT_KEY = "starlette.max_body_size"
# The dependant's parameters that make a route FastAPI's alone (read with getattr: older
# FastAPI releases lack some).
_OTHER_PARAMS = (
    "path_params",
    "query_params",
    "header_params",
    "cookie_params",
    "background_tasks_param_name",
    "response_param_name",
    "websocket_param_name",
    "http_connection_param_name",
    "security_scopes_param_name",
)


class _Hot:
    """What calling one route's endpoint takes: its route, body model and parameter names."""

    __slots__ = ("body", "endpoint", "model", "request", "route", "state")

    def __init__(self, route: APIRoute, model: type[BaseModel], names: tuple[str, str, str]):
        self.route = route
        self.endpoint: Callable[..., Any] = route.endpoint
        self.model = model
        self.body, self.request, self.state = names


def hot_route(route: APIRoute) -> _Hot | None:
    """What :class:`HotRoutes` needs to serve ``route``, or None when it must stay
    FastAPI's: the route class is FastAPI's own, the parameters are exactly one body model
    (not embedded), the request and :func:`~..state.get_state`, and the endpoint's answer is
    a response (no response model to serialize)."""
    dependant = route.dependant
    if type(route) is not APIRoute or route.response_model is not None:
        return None
    if (
        any(getattr(dependant, name, None) for name in _OTHER_PARAMS)
        or len(dependant.body_params) != 1
        or len(dependant.dependencies) != 1
        or dependant.request_param_name is None
        or getattr(route, "_embed_body_fields", True)
    ):
        return None
    state = dependant.dependencies[0]
    if state.call is not get_state or state.dependencies or state.name is None:
        return None
    body = dependant.body_params[0]
    model = body.field_info.annotation
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    return _Hot(route, model, (body.name, dependant.request_param_name, state.name))


class HotRoutes:
    """The router's stand-in for the routes in ``routes`` (path → route, POST only), and
    the router itself for every other request (see the module's docstring)."""

    def __init__(self, app: ASGIApp, routes: Mapping[str, APIRoute]) -> None:
        self.app = app
        self.routes = {path: hot for path, route in routes.items() if (hot := hot_route(route))}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = (
            self.routes.get(scope["path"])
            if scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and _BODY_LIMIT_KEY not in scope
            else None
        )
        if hot is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            data = await request.body()
        except Exception as exc:  # as FastAPI answers a body that could not be read
            detail = "There was an error parsing the body"
            raise HTTPException(status_code=400, detail=detail) from exc
        try:
            body = hot.model.model_validate(json.loads(data)) if data else None
        except Exception:  # not JSON, too deeply nested, not the model's: FastAPI answers
            body = None
        if body is None:
            # FastAPI's own route answers it (its 4xx, word for word), reading the same body.
            await self.app(scope, _replay(data, receive), send)
            return
        route = hot.route
        scope["route"] = route  # what FastAPI's routing leaves in the scope
        scope["endpoint"] = hot.endpoint
        scope["path_params"] = {}
        scope.setdefault("router", self.app)
        state = await get_state(request)
        response = await hot.endpoint(**{hot.body: body, hot.request: request, hot.state: state})
        if not isinstance(response, Response):
            raise TypeError(f"{route.path} answered {type(response).__name__}, not a response")
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` (already read) given again first."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
