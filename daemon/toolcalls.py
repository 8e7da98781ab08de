"""Tool calls and reasoning text in a model's output, recognised incrementally.

A model asked to call tools writes the call in its family's own syntax (``<tool_call>{...}
</tool_call>`` for Hermes and Qwen, ``[TOOL_CALLS]`` for Mistral, a bare JSON object for Llama
3.x, ...). The syntax is recognised from the chat template itself (:func:`detect_family`), as
llama.cpp's ``common/chat.cpp`` and Ollama's ``tools/template.go`` do, so a model needs no
per-name configuration.

Every parser here is incremental: :meth:`ToolCallParser.feed` takes the text pieces a stream
produces and returns a :class:`Parsed` with

* ``content``: text that is certainly not part of a call (safe to show now),
* ``calls``: calls complete and parsed (name, arguments as a dict),

while text that may be the beginning of a call is held back. :meth:`ToolCallParser.finish`
ends the stream: held text that turned out not to be a call comes out as plain content, so
nothing the model wrote is ever lost. Whitespace between calls, or between content and a
call, is not content (a reply that is only calls has empty content).

:class:`ThinkingSplitter` does the same for reasoning text (``<think>...</think>`` and the
families' equivalents); :class:`HarmonyParser` handles GPT-OSS, whose channels carry both.

:func:`tool_call_grammar` builds a GBNF grammar (strict JSON, see
:mod:`localllm.daemon.runner.jsongrammar`) that forces a call to one of the given tools in a
family's syntax, for ``tool_choice: "required"`` or a named function; :func:`lazy_triggers`
gives the patterns that start a lazy grammar for ``tool_choice: "auto"``.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar

__all__ = [
    "FAMILIES",
    "THINKING_SWITCHES",
    "GemmaParser",
    "GenericJsonParser",
    "GraniteParser",
    "HarmonyParser",
    "HermesParser",
    "Llama3Parser",
    "MistralParser",
    "OutputParser",
    "Parsed",
    "Qwen3CoderParser",
    "ThinkingSplitter",
    "ThinkingStyle",
    "ToolCall",
    "ToolCallParser",
    "ToolGrammarError",
    "detect_family",
    "detect_thinking",
    "grammar_syntax",
    "lazy_triggers",
    "new_call_id",
    "parser_for",
    "starts_thinking",
    "template_supports_tools",
    "thinking_style",
    "tool_call_grammar",
    "tool_names",
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


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    for key in ("parameters", "input_schema"):
        schema = function.get(key)
        if isinstance(schema, dict):
            return schema
    return {"type": "object"}


# --- helpers shared by the parsers ---------------------------------------------------------


def _held_prefix(text: str, markers: Iterable[str]) -> int:
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


class _JsonScanner:
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


def _loads(text: str) -> Any:
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
        arguments = _loads(arguments) if arguments.strip() else {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    call_id = obj.get("id")
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) and call_id else None)


def _calls_from(value: Any, known: Sequence[str] | None) -> list[ToolCall] | None:
    """Calls from a decoded object or list of objects; None if any item is not a call."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = [_call_from(item, known) for item in items]
    if any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def _python_calls(source: str, known: Sequence[str] | None) -> list[ToolCall] | None:
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
class _Reject:
    """The region is not a call: its first ``length`` characters are plain text."""

    length: int


@dataclass
class _Drop:
    """The region is call markup that holds no valid call: its first ``length`` characters
    are dropped (neither a call nor content)."""

    length: int


@dataclass
class _Cut:
    """The output ended inside a call region (``final``): ``bare`` when nothing followed the
    opener, which then may be prose that ended there."""

    bare: bool = False


@dataclass
class _Done:
    """The region held calls: ``length`` characters were consumed."""

    calls: list[ToolCall]
    length: int


_Outcome = _Need | _Reject | _Drop | _Cut | _Done


def _more(final: bool, bare: bool = False) -> _Outcome:
    """An unfinished call region: wait for more text, or, at the end, a cut call."""
    return _Cut(bare) if final else NEED_MORE


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
        return None, len(text) - _held_prefix(text, self.openers)

    openers: tuple[str, ...] = ()
    """Marker strings that open a call (for the default :meth:`_find_start`)."""

    @abstractmethod
    def _parse(self, text: str, final: bool) -> _Outcome:
        """Parse the call region at the start of ``text`` (``final``: no more text comes)."""

    def _reset_call(self) -> None:  # noqa: B027 - a hook most families need, not all
        """Forget per-call scanning state (called when a call region starts)."""

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
                    result = _Drop(len(stripped))  # not a call a model meant to make
                else:
                    return out
            self._in_call = False
            if isinstance(result, _Cut):
                if result.bare and not self._cut_end:
                    result = _Reject(len(stripped))  # an opener the output ended on: prose
                else:
                    out.dropped += stripped
                    out.cut = out.cut or self._cut_end
                    self._buffer = ""
                    return out
            if isinstance(result, _Drop):
                length = max(result.length, 1)
                out.dropped += stripped[:length]
                self._buffer = stripped[length:]
                continue
            if isinstance(result, _Done):
                out.calls.extend(result.calls)
                self._made_calls = True
                self._after_call = True
                self._any_output = True
                self._emitted_text = ""
                self._buffer = stripped[result.length :]
            elif isinstance(result, _Reject):
                length = max(result.length, 1)
                self._content(out, self._buffer[: skipped + length])
                self._buffer = self._buffer[skipped + length :]
        return out


def _past_closer(text: str, end: int, closer: str, final: bool) -> int | None:
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


class _TaggedJsonParser(ToolCallParser):
    """Calls as ``<open>`` + JSON (object or array) + optional ``<close>``."""

    opener: ClassVar[str] = ""
    closer: ClassVar[str] = ""

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self.openers = (self.opener,)

    def _reset_call(self) -> None:
        self._scanner = _JsonScanner()

    def _parse(self, text: str, final: bool) -> _Outcome:
        if len(text) < len(self.opener):
            return NEED_MORE if not final else _Reject(len(text))
        body_start = len(self.opener)
        body = text[body_start:]
        value = body.lstrip()
        offset = body_start + len(body) - len(value)
        if not value:
            return _more(final, bare=True)
        if value[0] not in "{[":
            return self._other_body(text, offset, final)
        end = self._scanner.end(value)
        if end is None:
            return _more(final)
        calls = _calls_from(_loads(value[:end]), None)
        consumed = _past_closer(text, offset + end, self.closer, final)
        if consumed is None:
            return NEED_MORE  # the closing marker may still come
        # JSON after the opener that is not a call is broken markup, not text
        return _Done(calls, consumed) if calls is not None else _Drop(consumed)

    def _other_body(self, text: str, offset: int, final: bool) -> _Outcome:
        """A body that does not start with JSON: by default, the opener was plain text."""
        return _Reject(len(self.opener))


class HermesParser(_TaggedJsonParser):
    """Hermes, Qwen 2.5, Qwen 3, QwQ: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
    </tool_call>``, one tag pair per call."""

    family = "hermes"
    opener = "<tool_call>"
    closer = "</tool_call>"

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates that show ``<tool_call>`` to the model."""
        return "<tool_call>" in template


class Qwen3CoderParser(HermesParser):
    """Qwen3-Coder and Qwen 3.5: ``<tool_call><function=f><parameter=x>value</parameter>
    </function></tool_call>``; values are raw text, typed by the tool's JSON schema."""

    family = "qwen3-coder"
    _FUNCTION = re.compile(r"<function=([^>\s]+)>")
    _PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates with ``<tool_call>`` that write ``<function=`` and ``<parameter=``."""
        return "<tool_call>" in template and "<function=" in template and "<parameter=" in template

    def _other_body(self, text: str, offset: int, final: bool) -> _Outcome:
        body = text[offset:]
        if not body.startswith("<function="):
            if "<function=".startswith(body):
                return _more(final)
            return _Reject(len(self.opener))
        end = body.find("</function>")
        if end < 0:
            return _more(final)
        consumed = _past_closer(text, offset + end + len("</function>"), self.closer, final)
        if consumed is None:
            return NEED_MORE
        match = self._FUNCTION.match(body)
        if match is None:
            return _Drop(consumed)
        name = match.group(1)
        schema = self._schema(name)
        arguments = {}
        for parameter in self._PARAMETER.finditer(body, match.end(), end):
            key, raw = parameter.group(1), parameter.group(2)
            arguments[key] = self._typed(raw, schema.get(key))
        return _Done([ToolCall(name, arguments)], consumed)

    def _schema(self, name: str) -> dict[str, Any]:
        for tool, tool_name in zip(self.tools, tool_names(self.tools), strict=False):
            if tool_name == name:
                properties = _parameters(tool).get("properties")
                return properties if isinstance(properties, dict) else {}
        return {}

    @staticmethod
    def _typed(raw: str, schema: Any) -> Any:
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return raw
        value = _loads(raw)
        return raw if value is None and raw.strip() != "null" else value


class Llama3Parser(ToolCallParser):
    """Llama 3.1-3.3: a bare ``{"name": "f", "parameters": {...}}`` object at the start of the
    output (or of a line, or after ``<|python_tag|>``), several separated by ``;``; built-in
    tools as ``<|python_tag|>brave_search.call(query="...")``. Untagged JSON counts as a call
    only if it names a declared tool."""

    family = "llama3"
    _TAG = "<|python_tag|>"
    _KEY_STARTS = ('"name"', '"type"', '"function"')

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates with the ``ipython`` role or ``<|python_tag|>``."""
        return "<|python_tag|>" in template or (
            "<|start_header_id|>" in template and "ipython" in template
        )

    def _reset_call(self) -> None:
        self._scanner = _JsonScanner()

    def _find_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        tag = text.find(self._TAG)
        limit = tag if tag >= 0 else len(text)
        # a `{` opens a candidate only where a call may stand: output or line start
        line_start = at_start
        for i in range(limit):
            c = text[i]
            if line_start and c == "{":
                return i, i
            if c == "\n" or (c == ";" and self._made_calls and not text[:i].strip()):
                line_start = True
            elif not c.isspace():
                line_start = False
        if tag >= 0:
            return tag, tag
        return None, len(text) - _held_prefix(text, (self._TAG,))

    def _parse(self, text: str, final: bool) -> _Outcome:
        if text.startswith(self._TAG):
            return self._tagged(text, final)
        if not text.startswith("{"):
            return _Reject(1)
        if not self._may_be_call(text):
            return _Reject(1)
        end = self._scanner.end(text)
        if end is None:
            # a call-shaped object cut off; a bare `{` alone may be prose
            return _more(final, bare=not text[1:].strip())
        calls = _calls_from(_loads(text[:end]), self.known)
        if calls is None:
            return _Reject(end)
        if not final and not text[end:].strip():
            return NEED_MORE  # a `;` and another call may follow
        return _Done(calls, self._separator(text, end))

    def _may_be_call(self, text: str) -> bool:
        """Cheap early refusal of prose in braces: the first key must be one a call has."""
        rest = text[1:].lstrip()
        if not rest:
            return True
        return any(k.startswith(rest[: len(k)]) for k in self._KEY_STARTS)

    @staticmethod
    def _separator(text: str, end: int) -> int:
        rest = text[end:]
        after = rest.lstrip()
        if after.startswith(";"):
            return end + len(rest) - len(after) + 1
        return end

    def _tagged(self, text: str, final: bool) -> _Outcome:
        body = text[len(self._TAG) :]
        value = body.lstrip()
        offset = len(text) - len(value)
        if not value:
            return _more(final, bare=True)
        if value[0] == "{":
            end = self._scanner.end(value)
            if end is None:
                return _more(final)
            calls = _calls_from(_loads(value[:end]), None)
            if calls is None:
                return _Drop(offset + end)
            if not final and not value[end:].strip():
                return NEED_MORE
            return _Done(calls, self._separator(text, offset + end))
        # built-in tool in Python syntax; it runs to the end of the message (<|eom_id|>)
        if not final:
            return NEED_MORE
        calls = _python_calls(value, None)
        if calls:
            return _Done(calls, len(text))
        return _Cut() if self._cut_end else _Drop(len(text))


class MistralParser(ToolCallParser):
    """Mistral Nemo, Small 3.x, Devstral, Magistral, Ministral: ``[TOOL_CALLS][{"name": ...,
    "arguments": {...}, "id": "..."}]`` (older templates) or ``[TOOL_CALLS]f[ARGS]{...}``
    (newer ones, optionally ``[CALL_ID]id`` before ``[ARGS]``), one marker per call."""

    family = "mistral"
    openers = ("[TOOL_CALLS]",)
    _NAME = re.compile(r"[A-Za-z0-9_.\-]+")

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates that show ``[TOOL_CALLS]``."""
        return "[TOOL_CALLS]" in template

    def _reset_call(self) -> None:
        self._scanner = _JsonScanner()

    def _parse(self, text: str, final: bool) -> _Outcome:
        marker = self.openers[0]
        body = text[len(marker) :]
        value = body.lstrip()
        offset = len(text) - len(value)
        if not value:
            return _more(final, bare=True)
        if value[0] in "[{":
            end = self._scanner.end(value)
            if end is None:
                return _more(final)
            calls = _calls_from(_loads(value[:end]), None)
            return _Done(calls, offset + end) if calls else _Drop(offset + end)
        return self._named(text, value, offset, final)

    def _named(self, text: str, value: str, offset: int, final: bool) -> _Outcome:
        match = self._NAME.match(value)
        if match is None:
            return _Reject(offset)
        name, rest = match.group(0), value[match.end() :]
        call_id = None
        if rest.startswith("[CALL_ID]"):
            id_match = self._NAME.match(rest, len("[CALL_ID]"))
            if id_match is None:
                return _more(final) if rest == "[CALL_ID]" else _Reject(offset)
            if id_match.end() == len(rest):
                return _more(final)
            call_id = id_match.group(0)
            rest = rest[id_match.end() :]
        if not rest.startswith("[ARGS]"):
            if "[ARGS]".startswith(rest) or "[CALL_ID]".startswith(rest):
                if not final:
                    return NEED_MORE
                if self._cut_end:
                    return _Cut()  # the end cut the call off after its name
            return _Reject(offset)
        args = rest[len("[ARGS]") :]
        args_offset = len(text) - len(args)
        if not args:
            return _more(final)
        if args[0] != "{":
            return _Drop(args_offset)
        end = self._scanner.end(args)
        if end is None:
            return _more(final)
        arguments = _loads(args[:end])
        if not isinstance(arguments, dict):
            return _Drop(args_offset + end)
        return _Done([ToolCall(name, arguments, call_id)], args_offset + end)


class GraniteParser(_TaggedJsonParser):
    """Granite 3.x: ``<|tool_call|>[{"name": ..., "arguments": {...}}]``; Phi-4-mini writes
    the same marker around one object (``<|tool_call|>{...}<|/tool_call|>``)."""

    family = "granite"
    opener = "<|tool_call|>"
    closer = "<|/tool_call|>"

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates that show ``<|tool_call|>``."""
        return "<|tool_call|>" in template


class GenericJsonParser(ToolCallParser):
    """Templates that take tools but show no call syntax: a JSON call object (or list of
    them) at the start of a line, or inside a fenced block (```json, ```tool_code,
    ```tool_call); ```tool_code blocks may also hold Python-style calls (``f(x=1)``). A call
    must name a declared tool."""

    family = "json"
    _FENCE_LABELS = ("json", "tool_code", "tool_call")
    _KEY_STARTS = ('"name"', '"type"', '"function"')

    @classmethod
    def matches(cls, template: str) -> bool:
        """The fallback for any template that renders ``tools``."""
        return True

    def _reset_call(self) -> None:
        self._scanner = _JsonScanner()

    def _find_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        line_start = at_start
        for i, c in enumerate(text):
            if line_start and c in "{[`":
                if c == "`":
                    tail = text[i:]
                    if tail.startswith("```") or "```".startswith(tail):
                        return i, i
                else:
                    return i, i
            if c == "\n":
                line_start = True
            elif not c.isspace():
                line_start = False
        return None, len(text)

    def _parse(self, text: str, final: bool) -> _Outcome:
        if text.startswith("`"):
            return self._fenced(text, final)
        rest = text[1:].lstrip()
        if text[0] == "[":
            if rest and rest[0] != "{":
                return _Reject(1)
            rest = rest[1:].lstrip()
        if rest and not any(k.startswith(rest[: len(k)]) for k in self._KEY_STARTS):
            return _Reject(1)
        end = self._scanner.end(text)
        if end is None:
            return _more(final, bare=not rest)
        calls = _calls_from(_loads(text[:end]), self.known)
        return _Done(calls, end) if calls else _Reject(end)

    def _fenced(self, text: str, final: bool) -> _Outcome:
        if len(text) < 3:
            return NEED_MORE if not final and "```".startswith(text) else _Reject(len(text))
        if not text.startswith("```"):
            return _Reject(1)
        newline = text.find("\n")
        if newline < 0:
            label = text[3:].strip()
            if final or not any(f.startswith(label) for f in self._FENCE_LABELS):
                return _Reject(len(text))
            return NEED_MORE
        label = text[3:newline].strip()
        if label not in self._FENCE_LABELS:  # other code blocks stream as they come
            return _Reject(newline + 1)
        close = text.find("```", newline + 1)
        if close < 0:
            return NEED_MORE if not final else _Reject(len(text))
        inner = text[newline + 1 : close]
        calls = _calls_from(_loads(inner), self.known) if inner.strip() else None
        if calls is None and label == "tool_code":
            calls = _python_calls(inner, self.known)
        return _Done(calls, close + 3) if calls else _Reject(close + 3)


class GemmaParser(GenericJsonParser):
    """Gemma-style prompting: calls in a ```tool_code block (Python-style or JSON), or a
    plain JSON object naming a declared tool."""

    family = "gemma"

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates that mention ``tool_code``."""
        return "tool_code" in template


class HarmonyParser(ToolCallParser):
    """GPT-OSS (the harmony format): messages ``<|channel|>analysis<|message|>...<|end|>``
    (reasoning), ``<|channel|>final<|message|>...`` (the answer) and
    ``<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>``
    (a call). The recipient may also follow the role: ``<|start|>assistant to=functions.f``."""

    family = "harmony"
    _ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
    _HEADER_OPENERS = ("<|channel|>", "<|start|>")
    _RECIPIENT = re.compile(r"to=([^\s<]+)")
    _CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")

    @classmethod
    def matches(cls, template: str) -> bool:
        """Templates with ``<|channel|>``."""
        return "<|channel|>" in template

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._state = "header"
        self._channel = "final"
        self._recipient: str | None = None
        self._body = ""

    def _parse(self, text: str, final: bool) -> _Outcome:  # pragma: no cover - not used
        raise NotImplementedError

    def feed(self, text: str) -> Parsed:
        """Take the next piece of output; return what is now certain."""
        self._buffer += text
        return self._step(final=False)

    def finish(self, cut: bool = False) -> Parsed:
        """The output ended (``<|call|>`` and ``<|return|>`` usually stop generation;
        ``cut``: the token limit ended it, so an open call was cut off)."""
        self._cut_end = cut
        out = self._step(final=True)
        if self._state == "header" and self._buffer:
            head = self._buffer.lstrip()
            if cut and any(head.startswith(m) or m.startswith(head) for m in self._HEADER_OPENERS):
                out.dropped += self._buffer  # a header cut off: markup, not text
                out.cut = True
            else:
                out.content += self._buffer  # not harmony after all
        elif self._state == "body":
            self._end_message(out, self._buffer, cut=cut)
        self._buffer = ""
        self._state = "header"
        return out

    def _step(self, final: bool) -> Parsed:
        out = Parsed()
        while self._buffer:
            if self._state == "header":
                text = self._buffer
                stripped = text.lstrip()
                if not stripped:
                    return out
                if not any(
                    stripped.startswith(m) or m.startswith(stripped) for m in self._HEADER_OPENERS
                ):
                    # plain text where a header was expected: the model skipped the format
                    self._channel, self._recipient, self._state = "final", None, "body"
                    continue
                at = text.find("<|message|>")
                if at < 0:
                    if len(text) > 4096:  # not a header a model writes
                        self._channel, self._recipient, self._state = "final", None, "body"
                        continue
                    return out
                header = text[:at]
                channel = self._CHANNEL.search(header)
                recipient = self._RECIPIENT.search(header)
                self._channel = channel.group(1) if channel else "final"
                self._recipient = recipient.group(1) if recipient else None
                self._buffer = text[at + len("<|message|>") :]
                self._body = ""
                self._state = "body"
            else:
                text = self._buffer
                ends = [(i, m) for m in self._ENDS if (i := text.find(m)) >= 0]
                if ends:
                    index, marker = min(ends)
                    self._end_message(out, text[:index])
                    # <|start|> begins the next message's header; the others close this one
                    rest = text[index:] if marker == "<|start|>" else text[index + len(marker) :]
                    self._buffer = rest
                    self._state = "header"
                    continue
                safe = len(text) if final else len(text) - _held_prefix(text, self._ENDS)
                self._body_text(out, text[:safe])
                self._buffer = text[safe:]
                return out
        return out

    def _is_call(self) -> bool:
        return bool(self._recipient and self._recipient.startswith("functions."))

    def _body_text(self, out: Parsed, text: str) -> None:
        if self._is_call():
            self._body += text
        elif self._channel == "analysis":
            out.thinking += text
        else:
            out.content += text

    def _end_message(self, out: Parsed, text: str, cut: bool = False) -> None:
        self._body_text(out, text)
        if self._is_call():
            assert self._recipient is not None
            name = self._recipient.removeprefix("functions.")
            arguments = _loads(self._body.strip() or "{}")
            if isinstance(arguments, dict):
                out.calls.append(ToolCall(name, arguments))
            else:  # not valid JSON (or cut off): call markup, never content
                out.dropped += self._body
                out.cut = out.cut or cut
        self._body = ""
        self._recipient = None
        self._channel = "final"


# --- detection --------------------------------------------------------------------------------

FAMILIES: tuple[type[ToolCallParser], ...] = (
    HarmonyParser,
    GraniteParser,
    Qwen3CoderParser,
    HermesParser,
    MistralParser,
    Llama3Parser,
    GemmaParser,
)
"""Families in the order they are tested (first match wins, as in llama.cpp: many templates
mention ``<tool_call>``, so the more specific markers come first)."""


@lru_cache(maxsize=64)
def template_supports_tools(template: str | None) -> bool:
    """Whether a Jinja chat template renders the ``tools`` it is given (Ollama's "tools"
    capability). Uses Jinja's own analysis of undeclared variables; a template Jinja cannot
    parse is judged by the text, as Ollama does (``tools`` or ``tool_call`` in it)."""
    if not template:
        return False
    try:
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
        return "tools" in meta.find_undeclared_variables(environment.parse(template))
    except Exception:
        return "tools" in template or "tool_call" in template


@lru_cache(maxsize=64)
def detect_family(template: str | None) -> type[ToolCallParser] | None:
    """The tool-call parser class for a chat template; None if it takes no tools."""
    if not template_supports_tools(template):
        return None
    assert template is not None
    for family in FAMILIES:
        if family.matches(template):
            return family
    return GenericJsonParser


def parser_for(
    template: str | None, tools: Sequence[dict[str, Any]] | None
) -> ToolCallParser | None:
    """A fresh parser for one response, or None if the template takes no tools."""
    family = detect_family(template)
    return family(tools) if family is not None else None


def grammar_syntax(template: str | None) -> str | None:
    """The call syntax name :func:`tool_call_grammar` and :func:`lazy_triggers` take for a
    template: its family, with Mistral split by whether calls are written ``f[ARGS]{...}``."""
    family = detect_family(template)
    if family is None:
        return None
    if family is MistralParser and template and "[ARGS]" in template:
        return "mistral-args"
    return family.family


# --- thinking -------------------------------------------------------------------------------

THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),  # Qwen3, QwQ, DeepSeek R1, Granite 3.2+
    ("[THINK]", "[/THINK]"),  # Magistral
    ("<|START_THINKING|>", "<|END_THINKING|>"),  # Command R7B
)


def detect_thinking(template: str | None) -> tuple[str, str] | None:
    """The (open, close) reasoning tags a template uses, or None. Harmony templates carry
    reasoning in channels instead: :class:`HarmonyParser` splits those."""
    if not template or "<|channel|>" in template:
        return None
    for open_tag, close_tag in THINK_TAGS:
        if open_tag in template and close_tag in template:
            return open_tag, close_tag
    return None


THINKING_SWITCHES: tuple[str, ...] = ("enable_thinking", "reasoning_effort", "thinking")
"""Template variables that turn reasoning on or off or set its level: ``enable_thinking``
(Qwen3, and every template llama.cpp renders), ``reasoning_effort`` (GPT-OSS: low, medium,
high), ``thinking`` (Granite 3.2+, DeepSeek V3.1)."""


@dataclass(frozen=True)
class ThinkingStyle:
    """How a chat template's model reasons: where the reasoning is in its output and which
    template switches control it."""

    tags: tuple[str, str] | None
    """(open, close) tags around reasoning in the output; None for harmony (channels)."""
    harmony: bool
    """GPT-OSS's channels: reasoning in ``analysis``, which cannot be switched off."""
    switches: frozenset[str]
    """Which of :data:`THINKING_SWITCHES` the template reads."""

    @property
    def takes_level(self) -> bool:
        """Whether a level (low, medium, high) changes the prompt, not just on or off."""
        return "reasoning_effort" in self.switches


def _template_variables(template: str) -> set[str]:
    """Variables a Jinja template reads without setting them (empty when it cannot parse)."""
    try:
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
        return set(meta.find_undeclared_variables(environment.parse(template)))
    except Exception:
        return set()


@lru_cache(maxsize=64)
def thinking_style(template: str | None) -> ThinkingStyle | None:
    """The reasoning a chat template supports (Ollama's ``thinking`` capability), or None.

    As Ollama judges it: a template showing ``<think>`` and ``</think>`` (or a family's
    equivalent tags) has a model that reasons; harmony templates reason in channels. A
    template with a reasoning switch but no tags in its text gets ``<think>`` tags, the
    output convention of every family whose template hides them."""
    if not template:
        return None
    harmony = "<|channel|>" in template
    tags = detect_thinking(template)
    switches = frozenset(_template_variables(template) & set(THINKING_SWITCHES))
    if harmony:
        return ThinkingStyle(tags=None, harmony=True, switches=switches)
    if tags is None and not switches:
        return None
    return ThinkingStyle(tags=tags or THINK_TAGS[0], harmony=False, switches=switches)


def starts_thinking(prompt_tail: str, open_tag: str) -> bool:
    """Whether a rendered prompt ends inside an open reasoning block (DeepSeek R1's and
    Qwen3's templates write ``<think>\\n`` themselves), so the answer starts as reasoning."""
    return prompt_tail.rstrip().endswith(open_tag)


class ThinkingSplitter:
    """Splits reasoning from the answer, incrementally.

    Reasoning is recognised only at the start of the output (after whitespace), as llama.cpp
    and Ollama do: a tag later in an answer is text the model is writing about, not its own
    reasoning. ``starts_thinking`` says the prompt already opened the block (DeepSeek R1's
    template ends with ``<think>\\n``), so output is reasoning until the close tag.
    """

    def __init__(self, open_tag: str, close_tag: str, *, starts_thinking: bool = False) -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._state = "thinking" if starts_thinking else "start"
        self._buffer = ""

    def feed(self, text: str) -> Parsed:
        """Take the next piece of output."""
        self._buffer += text
        return self._step(final=False)

    def finish(self) -> Parsed:
        """The output ended: release what was held back."""
        out = self._step(final=True)
        rest, self._buffer = self._buffer, ""
        if self._state == "thinking":
            out.thinking += rest
        elif self._state != "after" or rest.strip():
            out.content += rest
        return out

    def _step(self, final: bool) -> Parsed:
        out = Parsed()
        while self._buffer:
            text = self._buffer
            if self._state == "start":
                stripped = text.lstrip()
                if stripped.startswith(self.open_tag):
                    self._buffer = stripped[len(self.open_tag) :]
                    self._state = "thinking"
                    continue
                if not final and (not stripped or self.open_tag.startswith(stripped)):
                    return out
                self._state = "content"
                continue
            if self._state == "thinking":
                at = text.find(self.close_tag)
                if at >= 0:
                    out.thinking += text[:at]
                    self._buffer = text[at + len(self.close_tag) :]
                    self._state = "after"
                    continue
                safe = len(text) - _held_prefix(text, (self.close_tag,))
                out.thinking += text[:safe]
                self._buffer = text[safe:]
                return out
            if self._state == "after":
                # the blank lines templates put after the close tag are not answer text
                stripped = text.lstrip()
                if not stripped:
                    return out
                self._buffer = stripped
                self._state = "content"
                continue
            out.content += text
            self._buffer = ""
        return out


class OutputParser:
    """Thinking split and tool-call parsing together, as one response needs them.

    Reasoning comes first in the output, so the splitter sees the text first and its
    ``content`` goes on to the tool-call parser; harmony's parser does both itself.
    """

    def __init__(
        self,
        tools: ToolCallParser | None = None,
        thinking: ThinkingSplitter | None = None,
    ) -> None:
        self.tools = tools
        self.thinking = thinking if not isinstance(tools, HarmonyParser) else None

    def feed(self, text: str) -> Parsed:
        """Take the next piece of output."""
        return self._through(self.thinking.feed(text) if self.thinking else Parsed(text))

    def finish(self, cut: bool = False) -> Parsed:
        """The output ended (``cut``: by the token limit)."""
        out = self._through(self.thinking.finish() if self.thinking else Parsed())
        if self.tools is not None:
            out.add(self.tools.finish(cut))
        return out

    def _through(self, parsed: Parsed) -> Parsed:
        if self.tools is None or not parsed.content:
            return parsed
        out = self.tools.feed(parsed.content)
        out.thinking = parsed.thinking + out.thinking
        return out


# --- grammars -------------------------------------------------------------------------------


class ToolGrammarError(ValueError):
    """A tool's parameter schema cannot be turned into a grammar; ``index`` is the tool."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)


def _call_schema(name: str, parameters: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _rename_root(grammar: str, new_root: str) -> str:
    return re.sub(r"^root ::=", f"{new_root} ::=", grammar, count=1, flags=re.MULTILINE)


def _schema_grammar(schema: dict[str, Any], root: str, order: list[str]) -> str:
    from .runner.jsongrammar import schema_gbnf

    try:
        grammar = schema_gbnf(schema, order)
    except Exception as exc:
        raise ToolGrammarError(f"cannot build a grammar from the tool schemas: {exc}") from exc
    return _rename_root(grammar, root)


def _selected(
    tools: Sequence[dict[str, Any]], name: str | None
) -> list[tuple[str, dict[str, Any]]]:
    chosen = []
    for tool, tool_name in zip(tools, tool_names(tools), strict=False):
        if name is None or tool_name == name:
            chosen.append((tool_name, _parameters(tool)))
    if not chosen:
        raise ToolGrammarError(f"no tool named {name!r}" if name else "no tools to call")
    return chosen


def tool_call_grammar(
    family: str,
    tools: Sequence[dict[str, Any]],
    *,
    name: str | None = None,
    parallel: bool = True,
) -> str:
    """A GBNF grammar whose every sentence is a call (or, with ``parallel``, one or more
    calls) to one of ``tools`` (only ``name`` when given), in ``family``'s syntax, with
    arguments valid for the tool's JSON schema. The root rule is ``root``."""
    chosen = _selected(tools, name)
    if family == "harmony":
        rules = []
        alternatives = []
        for i, (tool_name, parameters) in enumerate(chosen):
            rules.append(_schema_grammar(parameters, f"args{i}", []))
            head = f"<|channel|>commentary to=functions.{tool_name} <|constrain|>json<|message|>"
            alternatives.append(f"{_gbnf_literal(head)} args{i}")
        # one call per assistant message; the runner stops at <|call|>
        return "\n".join([f"root ::= {' | '.join(alternatives)}", *rules]) + "\n"
    if family == "qwen3-coder":
        return _qwen3_coder_grammar(chosen, parallel)
    if family == "mistral-args":
        rules = []
        alternatives = []
        for i, (tool_name, parameters) in enumerate(chosen):
            rules.append(_schema_grammar(parameters, f"args{i}", []))
            alternatives.append(f"{_gbnf_literal('[TOOL_CALLS]' + tool_name + '[ARGS]')} args{i}")
        one = "call ::= " + " | ".join(alternatives)
        root = "root ::= call+" if parallel else "root ::= call"
        return "\n".join([root, one, *rules]) + "\n"
    key = "parameters" if family == "llama3" else "arguments"
    schema = {"oneOf": [_call_schema(n, p, key) for n, p in chosen]}
    if len(chosen) == 1:
        schema = schema["oneOf"][0]
    call_rules = _schema_grammar(schema, "call", ["name", key])
    many = parallel
    if family in ("hermes",):
        wrapped = '"<tool_call>\\n" call "\\n</tool_call>"'
        root = f'root ::= {wrapped} ("\\n" {wrapped})*' if many else f"root ::= {wrapped}"
    elif family == "mistral":
        root = 'root ::= "[TOOL_CALLS][" call ' + ('("," space call)* ' if many else "") + '"]"'
    elif family == "granite":
        root = 'root ::= "<|tool_call|>[" call ' + ('("," space call)* ' if many else "") + '"]"'
    elif family == "llama3":
        root = 'root ::= call ("; " call)*' if many else "root ::= call"
    else:  # json, gemma: a bare object, or a list of them
        root = 'root ::= call | "[" call ("," space call)* "]"' if many else "root ::= call"
    return f"{root}\n{call_rules}\n"


def _qwen3_coder_grammar(chosen: list[tuple[str, dict[str, Any]]], parallel: bool) -> str:
    """Qwen3-Coder's XML-ish calls: parameter values are free text up to ``</parameter>``
    (the schema types them after parsing), so only names are constrained."""
    rules = []
    for i, (tool_name, parameters) in enumerate(chosen):
        properties = parameters.get("properties")
        keys = list(properties) if isinstance(properties, dict) else []
        params = " | ".join(
            _gbnf_literal(f"<parameter={key}>\n") + " value " + _gbnf_literal("\n</parameter>\n")
            for key in keys
        )
        head = _gbnf_literal(f"<tool_call>\n<function={tool_name}>\n")
        tail = _gbnf_literal("</function>\n</tool_call>")
        rules.append(
            f"fn{i} ::= {head} ({params})* {tail}" if params else f"fn{i} ::= {head} {tail}"
        )
    names = " | ".join(f"fn{i}" for i in range(len(chosen)))
    root = f"root ::= ({names})" + (f' ("\\n" ({names}))*' if parallel else "")
    value = 'value ::= ([^<] | "<" [^/])*'
    return "\n".join([root, *rules, value]) + "\n"


def lazy_triggers(family: str) -> list[str]:
    """Regex patterns (llama.cpp's lazy-grammar ``trigger_patterns``) that switch a lazy
    tool-call grammar on for ``tool_choice: "auto"``: the grammar is fed from the first
    capture group, i.e. from the family's call opener. Empty when the family has no opener
    a grammar can wait for (bare JSON: Llama 3.x, the generic family)."""
    openers = {
        "hermes": "<tool_call>",
        "qwen3-coder": "<tool_call>",
        "mistral": "[TOOL_CALLS]",
        "mistral-args": "[TOOL_CALLS]",
        "granite": "<|tool_call|>",
        "harmony": "<|channel|>commentary to=functions.",
    }
    opener = openers.get(family)
    if opener is None:
        return []
    return [r"^[\s\S]*?(" + re.escape(opener) + r")[\s\S]*"]
