"""Tools as the model sees them: each MCP tool under a name unique in the chat, its input
schema checked once (a tool whose schema is not valid JSON Schema is left out, with a
warning, since the daemon could neither describe it to the model nor constrain a call to it),
and each call's arguments checked against it before anyone is asked to run it.

Schemas are checked with ``jsonschema`` (the validator the MCP SDK itself uses), against
the draft the schema names and 2020-12 otherwise, as MCP specifies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolSpec", "argument_problem", "assign_call_names", "schema_problem"]

_CALL_NAME = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64  # OpenAI's limit for function names, which templates are written for


@dataclass(frozen=True)
class ToolSpec:
    """One tool of one server."""

    server: str
    """The server's name in the config."""
    name: str
    """The tool's name on its server."""
    description: str = ""
    """What the server says it does."""
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    """JSON Schema of its arguments (an object)."""
    call_name: str = ""
    """The name the model calls it by (the tool's own unless two servers share it)."""

    @property
    def key(self) -> str:
        """``server/tool``: how settings and approvals name it."""
        return f"{self.server}/{self.name}"

    def as_function(self) -> dict[str, Any]:
        """The tool in the chat API's ``tools`` shape (Ollama's and OpenAI's alike)."""
        return {
            "type": "function",
            "function": {
                "name": self.call_name or self.name,
                "description": self.description,
                "parameters": dict(self.input_schema),
            },
        }


def _validator(schema: Mapping[str, Any]) -> Any:
    from jsonschema import Draft202012Validator, validators

    return validators.validator_for(dict(schema), default=Draft202012Validator)


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot describe a tool's arguments, or None when it can."""
    if not isinstance(schema, Mapping):
        return "its input schema is not an object"
    if schema.get("type", "object") != "object":
        return f"its input schema's type is {schema.get('type')!r}, not 'object'"
    from jsonschema.exceptions import SchemaError

    try:
        _validator(schema).check_schema(dict(schema))
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path) or "the top"
        return f"its input schema is not valid JSON Schema (at {where}: {exc.message})"
    return None


def argument_problem(schema: Mapping[str, Any], arguments: Any) -> str | None:
    """Why ``arguments`` do not fit ``schema`` (the first few problems), or None."""
    if not isinstance(arguments, dict):
        return f"the arguments must be a JSON object, got {type(arguments).__name__}"
    validator = _validator(schema)(dict(schema))
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))[:3]
    if not errors:
        return None
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.path)
        parts.append(f"{where}: {error.message}" if where else error.message)
    return "; ".join(parts)


def assign_call_names(tools: Iterable[ToolSpec]) -> list[ToolSpec]:
    """The tools with :attr:`ToolSpec.call_name` set: the tool's own name made safe for
    function names (letters, digits, ``_``, ``-``; 64 at most), prefixed with its server's
    where two tools would share it."""
    from dataclasses import replace

    tools = list(tools)
    plain = [_CALL_NAME.sub("_", tool.name)[:_MAX_NAME] or "tool" for tool in tools]
    counts: dict[str, int] = {}
    for name in plain:
        counts[name] = counts.get(name, 0) + 1
    named: list[ToolSpec] = []
    taken: set[str] = set()
    for tool, name in zip(tools, plain, strict=True):
        if counts[name] > 1:
            name = _CALL_NAME.sub("_", f"{tool.server}_{tool.name}")[:_MAX_NAME]
        unique, n = name, 2
        while unique in taken:  # still shared (long names cut alike): number them
            suffix = f"_{n}"
            unique, n = name[: _MAX_NAME - len(suffix)] + suffix, n + 1
        taken.add(unique)
        named.append(replace(tool, call_name=unique))
    return named
