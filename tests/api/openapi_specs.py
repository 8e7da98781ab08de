"""The official OpenAPI documents of OpenAI, Anthropic, Open Responses and Ollama
(``tests/api/openapi/``, whose README says where and when each was taken), and JSON-schema
validators for their component schemas, so tests can check real replies against them.

The newest whole Anthropic document that could be had is older than Anthropic's current spec;
what the current one changes in the schemas the daemon's replies use is kept apart, in
``anthropic-openapi-overlay.json`` (an OpenAPI Overlay 1.0 document, with its source), and
applied to it when it is read. Only the overlay forms it uses are applied: a ``$.a.b.c``
target, an object ``update`` merged into an object, a list ``update`` appended to a list.

An OpenAPI 3.1 document's schemas are JSON Schema 2020-12 (plus ``discriminator``, which a
validator ignores); each schema is checked with its ``$ref``s resolved inside the whole
document by the ``referencing`` registry ``jsonschema`` uses. OpenAI's document still marks
some fields with OpenAPI 3.0's ``nullable: true`` (a streamed choice's ``logprobs``), which
JSON Schema does not know: a null is accepted where a schema says so, as OpenAPI means it.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT202012

__all__ = ["ANTHROPIC", "OLLAMA", "OPENAI", "OPENRESPONSES", "check", "check_event", "problems"]

HERE = Path(__file__).parent / "openapi"
OPENAI = "openai"
ANTHROPIC = "anthropic"
OPENRESPONSES = "openresponses"
OLLAMA = "ollama"
_URIS = {
    OLLAMA: "urn:openapi:ollama",
    OPENAI: "urn:openapi:openai",
    ANTHROPIC: "urn:openapi:anthropic",
    OPENRESPONSES: "urn:openapi:openresponses",
}
_FILES = {
    ANTHROPIC: "anthropic-openapi.json.gz",
    OPENRESPONSES: "openresponses-openapi.json.gz",
}


def _merge(target: Any, update: Any) -> None:
    """Apply one overlay ``update`` to ``target`` in place."""
    if isinstance(target, list):
        target.extend(update)
        return
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _overlay(document: dict[str, Any], path: Path) -> dict[str, Any]:
    for action in json.loads(path.read_text(encoding="utf-8"))["actions"]:
        node: Any = document
        for key in action["target"].removeprefix("$.").split("."):
            node = node[key]
        _merge(node, action["update"])
    return document


@functools.cache
def _document(name: str) -> dict[str, Any]:
    if name in (OPENAI, OLLAMA):
        with gzip.open(HERE / f"{name}-openapi.yaml.gz", "rt", encoding="utf-8") as handle:
            return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # type: ignore[no-any-return]
    with gzip.open(HERE / _FILES[name], "rt", encoding="utf-8") as handle:
        document = json.load(handle)
    if name == ANTHROPIC:
        document = _overlay(document, HERE / "anthropic-openapi-overlay.json")
    return document  # type: ignore[no-any-return]


@functools.cache
def _registry(name: str) -> Registry:
    resource = DRAFT202012.create_resource(_document(name))
    return Registry().with_resource(_URIS[name], resource)


def _nullable(keyword: str) -> Any:
    """``keyword``'s check, passing a null where the schema is ``nullable``."""
    check = jsonschema.Draft202012Validator.VALIDATORS[keyword]

    def validate(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Any:
        if instance is None and schema.get("nullable") is True:
            return
        yield from check(validator, value, instance, schema)

    return validate


_OpenAPIValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {k: _nullable(k) for k in ("type", "enum", "const", "$ref")}
)


@functools.cache
def _validator(name: str, schema: str) -> Any:
    document = _document(name)
    assert schema in document["components"]["schemas"], f"{name} has no schema {schema}"
    reference = {"$ref": f"{_URIS[name]}#/components/schemas/{schema}"}
    return _OpenAPIValidator(reference, registry=_registry(name))


def problems(name: str, schema: str, instance: Any) -> list[str]:
    """Why ``instance`` is not a valid ``schema`` of the ``name`` document (empty: it is)."""
    validator = _validator(name, schema)
    out = []
    for error in validator.iter_errors(instance):
        # the deepest reason of a oneOf/anyOf, which says what is actually wrong
        best = jsonschema.exceptions.best_match([error])
        where = "/".join(str(p) for p in best.absolute_path) or "(top)"
        out.append(f"{where}: {best.message[:300]}")
    return out


def check(name: str, schema: str, instance: Any) -> None:
    """Assert that ``instance`` is a valid ``schema`` of the ``name`` document."""
    found = problems(name, schema, instance)
    assert not found, f"not a valid {name} {schema}:\n" + "\n".join(found) + f"\n{instance!r}"


def _union(name: str, union: str) -> dict[str, Any]:
    """``union``: a component schema, or ``POST /path`` for the event stream that the
    document gives that route (Open Responses names no schema for its stream)."""
    document = _document(name)
    if not union.startswith("POST "):
        return document["components"]["schemas"][union]  # type: ignore[no-any-return]
    answer = document["paths"][union.removeprefix("POST ")]["post"]["responses"]["200"]
    return answer["content"]["text/event-stream"]["schema"]  # type: ignore[no-any-return]


def _member(name: str, union: str, kind: str) -> str:
    """The schema of ``union`` (a ``oneOf``/``anyOf`` of events) whose ``type`` is ``kind``."""
    schemas = _document(name)["components"]["schemas"]
    found = _union(name, union)
    members = found.get("oneOf") or found.get("anyOf") or []
    for member in members:
        target = member.get("$ref", "").rsplit("/", 1)[-1]
        field = schemas.get(target, {}).get("properties", {}).get("type", {})
        if kind == field.get("const") or kind in field.get("enum", ()):
            return target
    raise AssertionError(f"{name} {union} has no event of type {kind!r}")


def check_event(name: str, union: str, event: dict[str, Any]) -> None:
    """Assert that ``event`` is a valid member of ``union`` (see :func:`_union`), checked
    against the member its ``type`` names (so a failure says what is wrong, not only that no
    member matched)."""
    check(name, _member(name, union, event.get("type", "")), event)
    if not union.startswith("POST "):
        check(name, union, event)
