"""JSON-schema grammars that accept exactly JSON.

llama-cpp-python's ``json_schema_to_gbnf`` (a port of llama.cpp's converter) writes its string
characters as ``[^"\\]``: a raw newline, tab or other control character passes, which JSON
forbids inside a string, so a constrained answer could fail ``json.loads`` (a forced tool call
came back as unparseable text). llama.cpp's own converter (``common/json-schema-to-grammar``)
refuses control characters and DEL; this module applies the same rule to every grammar built
from a schema, for ``format``/``response_format`` and for tool calls alike.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["STRICT_CHAR_RULE", "schema_gbnf"]

STRICT_CHAR_RULE = (
    r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] '
    r"[0-9a-fA-F] [0-9a-fA-F])"
)
"""A JSON string's character as JSON defines it: anything but a quote, a backslash or a
control character, or an escape."""

_CHAR_RULE = re.compile(r"^char ::= .*$", re.MULTILINE)


def schema_gbnf(schema: dict[str, Any], prop_order: list[str] | None = None) -> str:
    """The GBNF grammar (root rule ``root``) of the JSON values ``schema`` allows; raises what
    the converter raises for a schema it cannot read."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(json.dumps(schema), prop_order)
    return _CHAR_RULE.sub(lambda _: STRICT_CHAR_RULE, grammar)
