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
:mod:`localllm.daemon.engine.jsongrammar`) that forces a call to one of the given tools in a
family's syntax, for ``tool_choice: "required"`` or a named function; :func:`lazy_triggers`
gives the patterns that start a lazy grammar for ``tool_choice: "auto"``.

The modules: :mod:`.core` is the streaming core every family shares (:class:`ToolCallParser`,
:class:`Parsed`, the JSON and Python call readers); one module per family writes only how its
calls look (:mod:`.hermes`: Hermes, Qwen3-Coder, Granite; :mod:`.llama3`; :mod:`.mistral`;
:mod:`.generic`: bare JSON and Gemma; :mod:`.harmony`: GPT-OSS); :mod:`.detect` picks the
family from the template; :mod:`.thinking` and :mod:`.output` handle reasoning and put both
together; :mod:`.grammar` builds the grammars.
"""

from __future__ import annotations

from .core import Parsed, ToolCall, ToolCallParser, new_call_id, tool_names
from .detect import FAMILIES, detect_family, grammar_syntax, parser_for, template_supports_tools
from .generic import GemmaParser, GenericJsonParser
from .grammar import ToolGrammarError, lazy_triggers, tool_call_grammar
from .harmony import HarmonyParser
from .hermes import GraniteParser, HermesParser, Qwen3CoderParser
from .llama3 import Llama3Parser
from .mistral import MistralParser
from .output import OutputParser
from .thinking import (
    THINKING_SWITCHES,
    ThinkingSplitter,
    ThinkingStyle,
    detect_thinking,
    starts_thinking,
    thinking_style,
)

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
