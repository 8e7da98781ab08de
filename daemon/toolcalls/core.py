"""The streaming core every tool-call family shares: :class:`ToolCall` and :class:`Parsed`,
the incremental :class:`ToolCallParser` (it streams text around call regions, holds back what
may begin a call and turns rejected regions back into text), the outcomes a family's
``_parse`` returns for a call region, and the JSON and Python call readers the families use."""

from __future__ import annotations

import ast
import json
import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "MAX_CALL_CHARS",
    "NEED_MORE",
    "Cut",
    "Done",
    "Drop",
    "JsonScanner",
    "Outcome",
    "Parsed",
    "Reject",
    "ToolCall",
    "ToolCallParser",
    "calls_from",
    "held_prefix",
    "loads",
    "more",
    "new_call_id",
    "past_closer",
    "python_calls",
    "tool_names",
    "tool_parameters",
]

# Arguments bigger than this are not a call a local model meant to make; parsing stops there
# so a runaway generation cannot make the daemon hold megabytes of "maybe a call".
MAX_CALL_CHARS = 1 << 20


@dataclass(frozen=True)
class ToolCall:
    """One parsed call."""

    name: str
    """The function's name."""
    arguments: dict[str, Any]
    """Its arguments, key order as the model wrote them."""
    id: str | None = None
    """An id the model wrote itself (Mistral does); None otherwise."""


@dataclass
class Parsed:
    """What a piece of output turned out to be."""

    content: str = ""
    """Plain answer text."""
    thinking: str = ""
    """Reasoning text."""
    calls: list[ToolCall] = field(default_factory=list)
    """Complete calls, in order."""
    dropped: str = ""
    """Call markup that did not make a call (cut by the end of the output, or malformed):
    never content, so a client never sees half a call as text."""
    cut: bool = False
    """A call was cut off by the end of the output (the token limit): its markup is in
    ``dropped``, and the answer must say it was cut rather than claim a call."""

    def add(self, other: Parsed) -> Parsed:
        """Append ``other`` to this one (returns self)."""
        self.content += other.content
        self.thinking += other.thinking
        self.calls.extend(other.calls)
        if other.dropped:
            self.dropped += other.dropped
        self.cut = self.cut or other.cut
        return self

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.calls)


_ALNUM = string.ascii_lowercase + string.digits


def new_call_id(prefix: str = "call_") -> str:
    """A fresh call id as Ollama writes them: ``call_`` and 8 lower-case letters or digits."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(8))


def tool_names(tools: Sequence[dict[str, Any]] | None) -> list[str]:
    """Function names of OpenAI/Ollama tool definitions (``{"type": "function", "function":
    {"name": ...}}``, or the flat ``{"name": ...}`` of the Responses and Anthropic APIs)."""
    names = []
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and name:
            names.append(name)
    return names


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool definition's JSON schema of its arguments (``parameters``, or Anthropic's
    ``input_schema``); an open object when it has none."""
    function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    for key in ("parameters", "input_schema"):
        schema = function.get(key)
        if isinstance(schema, dict):
            return schema
    return {"type": "object"}


# --- helpers shared by the parsers ---------------------------------------------------------


def held_prefix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``markers``."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest


def _trailing_space(text: str) -> int:
    return len(text) - len(text.rstrip())


class JsonScanner:
    """Finds where a JSON object or array that starts a buffer ends, incrementally.

    Tracks strings and escapes so brackets inside strings do not count; bracket kinds are not
    matched against each other (``json.loads`` on the slice decides validity)."""

    def __init__(self) -> None:
        self.pos = 0
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.found: int | None = None

    def end(self, text: str) -> int | None:
        """Index just past the value that starts ``text[0]``, or None while it is incomplete."""
        if self.found is not None:
            return self.found
        for i in range(self.pos, len(text)):
            c = text[i]
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.found = i + 1
                    return self.found
        self.pos = len(text)
        return None


def loads(text: str) -> Any:
    """The JSON value of ``text``; None when it is not JSON (or nests absurdly deep)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _call_from(obj: Any, known: Sequence[str] | None) -> ToolCall | None:
    """A call from a decoded JSON object with ``name`` and ``arguments``/``parameters`` (or
    OpenAI's ``{"function": {...}}``); ``known`` names, when given, must contain the name."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        inner = dict(obj["function"])
        inner.setdefault("id", obj.get("id"))
        obj = inner
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    if known is not None and name not in known:
        return None
    arguments: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = loads(arguments) if arguments.strip() else {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    call_id = obj.get("id")
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) and call_id else None)


def calls_from(value: Any, known: Sequence[str] | None) -> list[ToolCall] | None:
    """Calls from a decoded object or list of objects; None if any item is not a call."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = [_call_from(item, known) for item in items]
    if any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def python_calls(source: str, known: Sequence[str] | None) -> list[ToolCall] | None:
    """Calls written as Python (``f(city="Paris")``, ``print(api.f(x=1))``, Llama's
    ``brave_search.call(query="x")``): keyword arguments with literal values only. The text is
    parsed, never run."""
    source = source.strip()
    if not source or len(source) > MAX_CALL_CHARS:
        return None
    try:
        tree = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    calls = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
            return None
        node = statement.value
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "print"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Call)
        ):
            node = node.args[0]
        parts = []
        target: ast.expr = node.func
        while isinstance(target, ast.Attribute):
            parts.append(target.attr)
            target = target.value
        if not isinstance(target, ast.Name):
            return None
        parts.append(target.id)
        parts.reverse()
        # default_api.f → f (Gemma); brave_search.call → brave_search (Llama's built-ins)
        name = parts[0] if parts[-1] == "call" and len(parts) == 2 else parts[-1]
        if node.args or (known is not None and name not in known):
            return None
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
        calls.append(ToolCall(name, arguments))
    return calls or None


# --- the parsers ------------------------------------------------------------------------------


class _Need:
    """Sentinel: the call region is incomplete, wait for more text."""


NEED_MORE = _Need()


@dataclass
class Reject:
    """The region is not a call: its first ``length`` characters are plain text."""

    length: int


@dataclass
class Drop:
    """The region is call markup that holds no valid call: its first ``length`` characters
    are dropped (neither a call nor content)."""

    length: int


@dataclass
class Cut:
    """The output ended inside a call region (``final``): ``bare`` when nothing followed the
    opener, which then may be prose that ended there."""

    bare: bool = False


@dataclass
class Done:
    """The region held calls: ``length`` characters were consumed."""

    calls: list[ToolCall]
    length: int


Outcome = _Need | Reject | Drop | Cut | Done


def more(final: bool, bare: bool = False) -> Outcome:
    """An unfinished call region: wait for more text, or, at the end, a cut call."""
    return Cut(bare) if final else NEED_MORE


class ToolCallParser(ABC):
    """An incremental tool-call parser for one template family.

    Subclasses say where a call may start (:meth:`_find_start`) and how a call region that
    begins the buffer is parsed (:meth:`_parse`). The base class streams text around them,
    holds back what may begin a call, and turns rejected regions back into text.
    """

    family: ClassVar[str] = ""
    """The family's short name (``hermes``, ``llama3``, ...)."""

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None) -> None:
        self.tools = list(tools or [])
        names = tool_names(self.tools)
        self.known: list[str] | None = names or None
        """Declared tool names; untagged JSON must name one of them to count as a call."""
        self._buffer = ""
        self._in_call = False
        self._emitted_text = ""  # the last few characters of content, for line-start checks
        self._any_output = False
        self._made_calls = False
        self._after_call = False
        self._cut_end = False
        self._scanner = JsonScanner()
        """Where the JSON value that starts a call region ends (for the JSON families)."""

    @classmethod
    @abstractmethod
    def matches(cls, template: str) -> bool:
        """Whether ``template`` (a Jinja chat template) belongs to this family."""

    def _find_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        """Where a call may begin in ``text`` (pending, not yet emitted); ``at_start`` says
        whether ``text`` begins at the start of the output or of a line. Returns (index of a
        certain start or None, number of leading characters that may be emitted now)."""
        index = min((i for i in (text.find(m) for m in self.openers) if i >= 0), default=-1)
        if index >= 0:
            return index, index
        return None, len(text) - held_prefix(text, self.openers)

    openers: tuple[str, ...] = ()
    """Marker strings that open a call (for the default :meth:`_find_start`)."""

    @abstractmethod
    def _parse(self, text: str, final: bool) -> Outcome:
        """Parse the call region at the start of ``text`` (``final``: no more text comes)."""

    def _reset_call(self) -> None:
        """Forget per-call scanning state (called when a call region starts)."""
        self._scanner = JsonScanner()

    def feed(self, text: str) -> Parsed:
        """Take the next piece of output; return what is now certain."""
        self._buffer += text
        return self._advance(final=False)

    def finish(self, cut: bool = False) -> Parsed:
        """The output ended (``cut``: by the token limit): parse what can be, and release the
        rest as content, except call markup: a call the end cut off, or one that holds no
        valid call, is dropped (``Parsed.dropped``, and ``Parsed.cut`` when it was cut)."""
        self._cut_end = cut
        out = self._advance(final=True)
        rest, self._buffer = self._buffer, ""
        if rest and cut and rest.strip():
            # the beginning of an opener, cut off: markup, not text
            out.dropped += rest
            out.cut = True
        elif rest and not (self._made_calls and not rest.strip()):
            self._content(out, rest)
        return out

    def _at_line_start(self) -> bool:
        tail = self._emitted_text
        return not self._any_output or tail.endswith("\n") or not tail.strip()

    def _content(self, out: Parsed, text: str) -> None:
        if self._after_call:  # whitespace right after a call separates, it is not content
            text = text.lstrip()
            self._after_call = not text
        if text:
            out.content += text
            self._emitted_text = (self._emitted_text + text)[-64:]
            self._any_output = True

    def _advance(self, final: bool) -> Parsed:
        out = Parsed()
        while self._buffer:
            if not self._in_call:
                start, safe = self._find_start(self._buffer, self._at_line_start())
                if start is None:
                    # Whitespace is held too: if a call follows, it belongs to neither side.
                    if not final:
                        safe -= _trailing_space(self._buffer[:safe])
                    self._content(out, self._buffer[:safe])
                    self._buffer = self._buffer[safe:]
                    return out
                before = self._buffer[:start]
                lead = _trailing_space(before)
                self._content(out, before[: len(before) - lead])
                self._buffer = self._buffer[len(before) - lead :]
                self._in_call = True
                self._reset_call()
            stripped = self._buffer.lstrip()
            skipped = len(self._buffer) - len(stripped)
            result = self._parse(stripped, final)
            if result is NEED_MORE or isinstance(result, _Need):
                if len(stripped) > MAX_CALL_CHARS:
                    result = Drop(len(stripped))  # not a call a model meant to make
                else:
                    return out
            self._in_call = False
            if isinstance(result, Cut):
                if result.bare and not self._cut_end:
                    result = Reject(len(stripped))  # an opener the output ended on: prose
                else:
                    out.dropped += stripped
                    out.cut = out.cut or self._cut_end
                    self._buffer = ""
                    return out
            if isinstance(result, Drop):
                length = max(result.length, 1)
                out.dropped += stripped[:length]
                self._buffer = stripped[length:]
                continue
            if isinstance(result, Done):
                out.calls.extend(result.calls)
                self._made_calls = True
                self._after_call = True
                self._any_output = True
                self._emitted_text = ""
                self._buffer = stripped[result.length :]
            elif isinstance(result, Reject):
                length = max(result.length, 1)
                self._content(out, self._buffer[: skipped + length])
                self._buffer = self._buffer[skipped + length :]
        return out


def past_closer(text: str, end: int, closer: str, final: bool) -> int | None:
    """Where a call region that ends at ``end`` really ends: past ``closer`` (and the space
    before it) when it follows; None while a closer may still be coming. At the end of the
    output a closer it cut goes with the call."""
    if not closer:
        return end
    rest = text[end:]
    after = rest.lstrip()
    if after.startswith(closer):
        return end + len(rest) - len(after) + len(closer)
    if closer.startswith(after):
        return len(text) if final else None
    return end
