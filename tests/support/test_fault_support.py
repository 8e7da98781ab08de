"""Helpers for the fault and load tests (no tests here).

* :func:`is_json_prefix`: whether a text can still be completed into one JSON value (what a
  grammar-constrained answer cut off by ``num_predict`` must be);
* :func:`rss_bytes`: a process's resident memory, from ``/proc/<pid>/status``;
* :func:`read_stream`: read one NDJSON or SSE stream to its end and say how it ended (final
  chunk, error event, or neither);
* :func:`create_from_file`: register a GGUF file under a name through ``/api/create``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "StreamEnd",
    "create_from_file",
    "is_json_prefix",
    "read_stream",
    "rss_bytes",
    "short_answer",
]

# -- JSON prefixes --------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WHITESPACE = " \t\n\r"
_LITERALS = ("true", "false", "null")


def _number_prefix_ok(text: str) -> bool:
    # A prefix of a number is a number, or becomes one with one more digit ("-", "1.", "1e+").
    return bool(_NUMBER.fullmatch(text) or _NUMBER.fullmatch(text + "0"))


def is_json_prefix(text: str) -> bool:
    """True when ``text`` is the start of (or all of) one JSON value, surrounding whitespace
    allowed: some continuation makes it valid JSON. ``""`` is a prefix; ``"{]"`` is not."""
    stack: list[str] = []  # "{" or "["
    # What may come next: "value", "key" (a string key or "}" right after "{"), "key!" (a key
    # after ","), "colon", "after" (a "," or the container's end), "end" (whitespace only).
    expect = "value"
    first_in_container = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
            continue
        if expect == "end":
            return False
        if expect == "colon":
            if c != ":":
                return False
            expect, i = "value", i + 1
            continue
        if expect == "after":
            if c == ",":
                expect = "key!" if stack[-1] == "{" else "value"
                first_in_container = False
            elif (c == "}" and stack[-1] == "{") or (c == "]" and stack[-1] == "["):
                stack.pop()
                expect = "after" if stack else "end"
            else:
                return False
            i += 1
            continue
        if expect in ("key", "key!"):
            if c == "}" and expect == "key":
                stack.pop()
                expect, i = ("after" if stack else "end"), i + 1
                continue
            if c != '"':
                return False
        # a value (or a key, which is a string)
        if c == "]" and expect == "value" and first_in_container and stack and stack[-1] == "[":
            stack.pop()
            expect, i = ("after" if stack else "end"), i + 1
            first_in_container = False
            continue
        first_in_container = False
        if c == '"':
            j = i + 1
            while j < n:
                d = text[j]
                if d == "\\":
                    if j + 1 >= n:
                        return True  # cut inside an escape
                    e = text[j + 1]
                    if e == "u":
                        hexits = text[j + 2 : j + 6]
                        if not all(h in "0123456789abcdefABCDEF" for h in hexits):
                            return False
                        if len(hexits) < 4:
                            return True
                        j += 6
                    elif e in '"\\/bfnrt':
                        j += 2
                    else:
                        return False
                elif d == '"':
                    break
                elif ord(d) < 0x20:
                    return False
                else:
                    j += 1
            if j >= n:
                return True  # cut inside the string
            was_key = expect in ("key", "key!")
            i = j + 1
            expect = "colon" if was_key else ("after" if stack else "end")
            continue
        if c in "{[":
            stack.append(c)
            expect = "key" if c == "{" else "value"
            first_in_container = c == "["
            i += 1
            continue
        if c == "-" or c.isdigit():
            j = i
            while j < n and text[j] in "0123456789+-.eE":
                j += 1
            token = text[i:j]
            if j >= n:
                return _number_prefix_ok(token)
            if not _NUMBER.fullmatch(token):
                return False
            i, expect = j, ("after" if stack else "end")
            continue
        literal = next((word for word in _LITERALS if word[0] == c), None)
        if literal is None:
            return False
        piece = text[i : i + len(literal)]
        if not literal.startswith(piece):
            return False
        if len(piece) < len(literal):
            return True  # cut inside the literal
        i, expect = i + len(literal), ("after" if stack else "end")
    return True


# -- processes ------------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (``VmRSS`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def short_answer(http: httpx.Client, model: str, prompt: str) -> dict[str, Any]:
    """A three-token ``/api/generate`` answer, which must come (the daemon still serves)."""
    answer = http.post(
        "/api/generate",
        json={"model": model, "prompt": prompt, "stream": False, "options": {"num_predict": 3}},
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def create_from_file(http: httpx.Client, name: str, path: Path) -> None:
    """``/api/create`` ``name`` from a GGUF file the daemon can read."""
    response = http.post("/api/create", json={"model": name, "from": str(path), "stream": False})
    assert response.status_code == 200, response.text


# -- streams ----------------------------------------------------------------------------------


@dataclass
class StreamEnd:
    """How one streaming request went."""

    status: int
    """HTTP status."""
    headers: dict[str, str]
    """Response headers (lower-case names)."""
    events: list[Any] = field(default_factory=list)
    """Parsed NDJSON objects or SSE ``data:`` payloads (``[DONE]`` excluded)."""
    finished: bool = False
    """The final chunk arrived: ``done: true`` (Ollama) or ``data: [DONE]`` (OpenAI)."""
    error: Any = None
    """The error event's ``error`` field, when the stream ended with one."""
    body: str = ""
    """The whole body of a non-200 answer."""
    after_end: list[str] = field(default_factory=list)
    """Anything the server sent after the final chunk or error (must be empty)."""

    @property
    def text(self) -> str:
        """The generated text, joined from the chunks."""
        parts = []
        for event in self.events:
            if not isinstance(event, dict):
                continue
            if "response" in event:
                parts.append(event["response"])
            elif isinstance(event.get("message"), dict):
                parts.append(event["message"].get("content") or "")
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                parts.append(delta.get("content") or choice.get("text") or "")
        return "".join(parts)

    @property
    def final(self) -> Any:
        """The last event before the end."""
        return self.events[-1] if self.events else None


def _ndjson(line: str) -> tuple[Any, bool]:
    event = json.loads(line)
    return event, event.get("done") is True


def _sse(line: str) -> tuple[Any, bool]:
    assert line.startswith("data: "), line
    payload = line.removeprefix("data: ")
    if payload.strip() == "[DONE]":
        return None, True
    return json.loads(payload), False


async def read_stream(
    http: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    on_event: Callable[[Any], None] | None = None,
) -> StreamEnd:
    """POST a streaming request and read it to the end: server-sent events for OpenAI's
    routes (``/v1/...``), NDJSON for Ollama's; ``on_event`` sees each event as it arrives."""
    parse = _sse if path.startswith("/v1/") else _ndjson
    async with http.stream("POST", path, json=body) as response:
        end = StreamEnd(response.status_code, {k.lower(): v for k, v in response.headers.items()})
        if response.status_code != 200:
            end.body = (await response.aread()).decode(errors="replace")
            return end
        ended = False
        async for line in response.aiter_lines():
            if not line.strip():
                continue
            if ended:
                end.after_end.append(line)
                continue
            event, final = parse(line)
            if event is not None:
                end.events.append(event)
                if on_event is not None:
                    on_event(event)
                if "error" in event:
                    end.error, ended = event["error"], True
                    continue
            if final:
                end.finished, ended = True, True
        return end
