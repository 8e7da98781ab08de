"""Tool-call parsers and the thinking splitter, on outputs as the model families write them.

Each case is fed whole, at every split point into two pieces, and one character at a time:
the parsed result must be the same however the stream was cut, and text streamed as content
must never contain call syntax.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from localllm.daemon.toolcalls import (
    GemmaParser,
    GenericJsonParser,
    GraniteParser,
    HarmonyParser,
    HermesParser,
    Llama3Parser,
    MistralParser,
    OutputParser,
    Parsed,
    Qwen3CoderParser,
    ThinkingSplitter,
    ToolCall,
    detect_family,
    detect_thinking,
    grammar_syntax,
    lazy_triggers,
    new_call_id,
    parser_for,
    starts_thinking,
    template_supports_tools,
    thinking_style,
    tool_call_grammar,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
TOOLS = [WEATHER, TIME]

Factory = Callable[[], object]


def _run(make: Callable[[], object], pieces: list[str], cut: bool = False) -> Parsed:
    parser = make()
    out = Parsed()
    for piece in pieces:
        step = parser.feed(piece)  # type: ignore[attr-defined]
        out.add(step)
    out.add(parser.finish(cut) if cut else parser.finish())  # type: ignore[attr-defined]
    return out


def _splits(text: str) -> list[list[str]]:
    cuts = [[text], list(text)]
    cuts += [[text[:i], text[i:]] for i in range(1, len(text))]
    cuts += [[text[:i], text[i:j], text[j:]] for i in range(1, len(text), 7) for j in (i + 3,)]
    return cuts


def check(
    make: Callable[[], object],
    text: str,
    content: str,
    calls: list[ToolCall],
    thinking: str = "",
    forbidden: tuple[str, ...] = (),
) -> None:
    """``text`` parses to ``content`` and ``calls`` however it is cut into pieces."""
    for pieces in _splits(text):
        out = _run(make, pieces)
        assert out.calls == calls, pieces
        assert out.content == content, pieces
        assert out.thinking == thinking, pieces
        for marker in forbidden:
            assert marker not in out.content


# Cases that are one output each, checked by test_output_parses_the_same_however_it_is_cut.
CASES: list[Any] = []


def _case(name: str, *args: Any, **kwargs: Any) -> Any:
    """A case named ``name``: the arguments of :func:`check`."""
    return pytest.param(args, kwargs, id=name)


# --- Hermes / Qwen ---------------------------------------------------------------------------

QWEN_ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
QWEN_TWO = (
    "I'll check both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
    "</tool_call>\n"
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>'
)
HERMES = partial(HermesParser, TOOLS)
LOOKS_LIKE_A_CALL = "Use the <tool_call> tag like <tool_call>this</tool_call>, or write <tool_ca."

CASES += [
    _case(
        "hermes-one-call",
        HERMES,
        QWEN_ONE,
        "",
        [ToolCall("get_weather", {"city": "Paris"})],
        forbidden=("<tool_call>",),
    ),
    _case(
        "hermes-text-then-two-calls",
        HERMES,
        QWEN_TWO,
        "I'll check both.",
        [
            ToolCall("get_weather", {"city": "Paris", "days": 2}),
            ToolCall("get_time", {"zone": "Europe/Paris"}),
        ],
        forbidden=("<tool", "</tool"),
    ),
    _case(
        "hermes-plain-text-that-looks-like-a-call", HERMES, LOOKS_LIKE_A_CALL, LOOKS_LIKE_A_CALL, []
    ),
    _case(
        "hermes-braces-and-tags-inside-strings",
        HERMES,
        '<tool_call>{"name": "get_weather", "arguments": {"city": "a}]</tool_call>\\"{"}}'
        "</tool_call>",
        "",
        [ToolCall("get_weather", {"city": 'a}]</tool_call>"{'})],
    ),
    # generation stopped (EOS or a stop string) right after the JSON
    _case(
        "hermes-call-cut-off-without-closing-tag",
        HERMES,
        'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {}}',
        "Sure.",
        [ToolCall("get_time", {})],
    ),
    _case(
        "hermes-text-after-a-call-is-content",
        HERMES,
        QWEN_ONE + "\nDone.",
        "Done.",
        [ToolCall("get_weather", {"city": "Paris"})],
    ),
    _case(
        "qwen3-coder-xml-calls",
        partial(Qwen3CoderParser, TOOLS),
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=zone>\n42\n</parameter>\n</function>\n"
        "</tool_call>",
        "",
        [
            ToolCall("get_weather", {"city": "New York", "days": 3}),
            ToolCall("get_time", {"zone": "42"}),  # the schema says string: kept as text
        ],
    ),
    _case(
        "qwen3-coder-still-reads-json-calls",
        partial(Qwen3CoderParser, TOOLS),
        QWEN_ONE,
        "",
        [ToolCall("get_weather", {"city": "Paris"})],
    ),
]


def test_hermes_invalid_json_is_dropped_markup() -> None:
    text = (
        'Before <tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call> after'
    )
    check(HERMES, text, "Before after", [], forbidden=("<tool", "{"))
    out = _run(HERMES, [text])
    assert "<tool_call>" in out.dropped and not out.cut


def test_hermes_unfinished_call_is_never_content() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "get_time", "argu'
    check(HERMES, text, "Sure.", [], forbidden=("<tool",))
    out = _run(HERMES, [text])
    assert out.dropped.startswith("<tool_call>") and not out.cut  # ended, not cut
    cut = _run(HERMES, [text], cut=True)
    assert cut.cut and cut.content == "Sure." and not cut.calls


def test_hermes_streams_text_before_a_call_at_once() -> None:
    parser = HermesParser(TOOLS)
    assert parser.feed("Let me look").content == "Let me look"
    assert parser.feed(" that up <tool").content == " that up"
    step = parser.feed('_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert step.content == "" and step.calls == [ToolCall("get_time", {})]
    assert not parser.finish()


# --- Llama 3.x -------------------------------------------------------------------------------

LLAMA3 = partial(Llama3Parser, TOOLS)

CASES += [
    _case(
        "llama3-bare-json-call",
        LLAMA3,
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 1}}',
        "",
        [ToolCall("get_weather", {"city": "Paris", "days": 1})],
    ),
    _case(
        "llama3-with-type-and-python-tag",
        LLAMA3,
        '<|python_tag|>{"type": "function", "name": "get_time", "parameters": {"zone": "UTC"}}',
        "",
        [ToolCall("get_time", {"zone": "UTC"})],
    ),
    _case(
        "llama3-several-calls-separated-by-semicolons",
        LLAMA3,
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "parameters": {"zone": "CET"}}',
        "",
        [ToolCall("get_weather", {"city": "Oslo"}), ToolCall("get_time", {"zone": "CET"})],
    ),
    _case(
        "llama3-builtin-tool-in-python-syntax",
        LLAMA3,
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        "",
        [ToolCall("brave_search", {"query": "weather in Paris"})],
    ),
]
# JSON that is not a call is text.
CASES += [
    _case(f"llama3-not-a-call-{i}", LLAMA3, text, text, [])
    for i, text in enumerate(
        (
            '{"name": "Alice", "age": 3}',  # no parameters and not a declared tool
            '{"name": "unknown_tool", "parameters": {}}',
            '{"city": "Paris"}',
            "The set {1, 2} has two elements.\n{ not json",
            'Here it is: {"name": "get_time", "parameters": {}} inline',  # mid-line: prose
        )
    )
]


def test_llama3_does_not_hold_prose_in_braces() -> None:
    parser = Llama3Parser(TOOLS)
    assert parser.feed("{this is").content == "{this is"


# --- Mistral ---------------------------------------------------------------------------------

MISTRAL = partial(MistralParser, TOOLS)

CASES += [
    _case(
        "mistral-array-with-ids",
        MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"},'
        ' {"name": "get_time", "arguments": {}, "id": "f5g6h7i8j"}]',
        "",
        [
            ToolCall("get_weather", {"city": "Paris"}, "a1b2c3d4e"),
            ToolCall("get_time", {}, "f5g6h7i8j"),
        ],
    ),
    _case(
        "mistral-args-syntax-with-call-ids",
        MISTRAL,
        'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}'
        '[TOOL_CALLS]get_time[CALL_ID]abc123XYZ[ARGS]{"zone": "UTC"}',
        "Checking.",
        [
            ToolCall("get_weather", {"city": "Lyon"}),
            ToolCall("get_time", {"zone": "UTC"}, "abc123XYZ"),
        ],
    ),
]
# The marker in prose is text.
CASES += [
    _case(f"mistral-marker-in-prose-{i}", MISTRAL, text, text, [])
    for i, text in enumerate(("Write [TOOL_CALLS] then the calls.", "a [TOOL_CALL] b [TOOL_CALLS]"))
]


# --- Granite / Phi-4-mini --------------------------------------------------------------------

CASES += [
    _case(
        "granite-list",
        partial(GraniteParser, TOOLS),
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]',
        "",
        [ToolCall("get_weather", {"city": "Rome"}), ToolCall("get_time", {"zone": "CET"})],
    ),
    _case(
        "phi4-mini-object-with-closing-marker",
        partial(GraniteParser, TOOLS),
        'OK <|tool_call|>{"name": "get_time", "arguments": {"zone": "PST"}}<|/tool_call|>',
        "OK",
        [ToolCall("get_time", {"zone": "PST"})],
    ),
]


# --- Gemma-style and generic JSON ------------------------------------------------------------

GENERIC = partial(GenericJsonParser, TOOLS)

CASES += [
    _case(
        "gemma-tool-code-python-call",
        partial(GemmaParser, TOOLS),
        '```tool_code\nprint(default_api.get_weather(city="Paris", days=2))\n```',
        "",
        [ToolCall("get_weather", {"city": "Paris", "days": 2})],
    ),
    _case(
        "gemma-json-fence",
        partial(GemmaParser, TOOLS),
        'Sure!\n```json\n{"name": "get_time", "parameters": {"zone": "UTC"}}\n```',
        "Sure!",
        [ToolCall("get_time", {"zone": "UTC"})],
    ),
    _case(
        "generic-plain-json",
        GENERIC,
        '[{"name": "get_time", "arguments": {}}, '
        '{"name": "get_weather", "arguments": {"city": "Nice"}}]',
        "",
        [ToolCall("get_time", {}), ToolCall("get_weather", {"city": "Nice"})],
    ),
]
# Code and data stay text.
CASES += [
    _case(f"generic-json-code-and-data-{i}", GENERIC, text, text, [])
    for i, text in enumerate(
        (
            "```python\nprint(get_weather(city='x'))\n```",  # an example, not a tool_code block
            '```json\n{"city": "Paris"}\n```',
            '{"name": "Bob", "parameters": {}}',  # not a declared tool
            "[link](http://x)\n[1, 2]",
            "```tool_code\nimport os\n```",  # tool_code, but not a call
        )
    )
]


# --- Harmony (GPT-OSS) -----------------------------------------------------------------------

HARMONY = partial(HarmonyParser, TOOLS)

CASES += [
    _case(
        "harmony-reasoning-then-answer",
        HARMONY,
        "<|channel|>analysis<|message|>User greets. Answer.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello there!",
        "Hello there!",
        [],
        thinking="User greets. Answer.",
    ),
    # the recipient after the channel, then before it
    _case(
        "harmony-call-recipient-after-channel",
        HARMONY,
        "<|channel|>analysis<|message|>Need weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>',
        "",
        [ToolCall("get_weather", {"city": "Paris"})],
        thinking="Need weather.",
    ),
    _case(
        "harmony-call-recipient-before-channel",
        HARMONY,
        "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}",
        "",
        [ToolCall("get_time", {})],
    ),
    _case("harmony-plain-output-is-content", HARMONY, "Just text <|x", "Just text <|x", []),
]


# --- thinking --------------------------------------------------------------------------------

THINK = partial(ThinkingSplitter, "<think>", "</think>")
TAGS_IN_PROSE = "Tags like <think> and </think> mark reasoning."

CASES += [
    _case(
        "think-tags-split",
        THINK,
        "<think>\nThe user wants 2+2.\n</think>\n\n4",
        "4",
        [],
        thinking="\nThe user wants 2+2.\n",
    ),
    _case("think-tag-later-in-the-answer-is-text", THINK, TAGS_IN_PROSE, TAGS_IN_PROSE, []),
    _case(
        "prompt-opened-thinking",
        partial(ThinkingSplitter, "<think>", "</think>", starts_thinking=True),
        "Let me see.</think>The answer is 4.",
        "The answer is 4.",
        [],
        thinking="Let me see.",
    ),
    _case(
        "unfinished-thinking-stays-thinking",
        partial(ThinkingSplitter, "[THINK]", "[/THINK]"),
        "[THINK]hmm, still going",
        "",
        [],
        thinking="hmm, still going",
    ),
    _case(
        "thinking-then-tool-call",
        lambda: OutputParser(HermesParser(TOOLS), ThinkingSplitter("<think>", "</think>")),
        "<think>I should call it.</think>\n\n" + QWEN_ONE,
        "",
        [ToolCall("get_weather", {"city": "Paris"})],
        thinking="I should call it.",
    ),
]


@pytest.mark.parametrize(("args", "kwargs"), CASES)
def test_output_parses_the_same_however_it_is_cut(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    check(*args, **kwargs)


# --- detection -------------------------------------------------------------------------------

QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}"
    "{{ tool | tojson }}{% endfor %}</tools>\nFor each function call, return a json object "
    "within <tool_call></tool_call> XML tags{% endif %}{% for message in messages %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_TEMPLATE = (
    "{% for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n"
    "{{ message.content }}<|eot_id|>{% endfor %}{% if tools %}Use tools: {{ tools | tojson }}"
    "{% endif %}{% if message.role == 'ipython' %}x{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls[0].function.name }}"
    "[ARGS]{{ m.tool_calls[0].function.arguments }}{% endif %}{% endfor %}"
)
CHATML_NO_TOOLS = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "family"),
    [
        (QWEN_TEMPLATE, HermesParser),
        (QWEN_TEMPLATE.replace("</tools>", "</tools><function=x><parameter=y>"), Qwen3CoderParser),
        (LLAMA_TEMPLATE, Llama3Parser),
        (MISTRAL_TEMPLATE, MistralParser),
        ("{% if tools %}<|tool_call|>{% endif %}", GraniteParser),
        ("{% if tools %}<|channel|>commentary{% endif %}", HarmonyParser),
        ("{% if tools %}```tool_code{% endif %}", GemmaParser),
        ("{% for t in tools %}{{ t.function.name }}{% endfor %}", GenericJsonParser),
        (CHATML_NO_TOOLS, None),
        ("{{ messages[0]['content'] }} say tools", None),  # the word is not the variable
        (None, None),
    ],
)
def test_detect_family(template: str | None, family: type | None) -> None:
    assert detect_family(template) is family
    assert template_supports_tools(template) is (family is not None)
    parser = parser_for(template, TOOLS)
    assert (type(parser) if parser is not None else None) is family


def test_grammar_syntax_and_thinking_detection() -> None:
    assert grammar_syntax(MISTRAL_TEMPLATE) == "mistral-args"
    assert grammar_syntax(QWEN_TEMPLATE) == "hermes"
    assert grammar_syntax(CHATML_NO_TOOLS) is None
    assert detect_thinking("{{ '<think>' }}x{{ '</think>' }}") == ("<think>", "</think>")
    assert detect_thinking("<|channel|><think></think>") is None
    assert detect_thinking(CHATML_NO_TOOLS) is None


def test_thinking_style() -> None:
    qwen3 = (
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
        "{% endif %}{% endif %}"
    )
    style = thinking_style(qwen3)
    assert style is not None and style.tags == ("<think>", "</think>")
    assert style.switches == {"enable_thinking"} and not style.takes_level
    assert not style.harmony
    harmony = "<|start|>system<|message|>Reasoning: {{ reasoning_effort }}<|channel|>"
    style = thinking_style(harmony)
    assert style is not None and style.harmony and style.tags is None and style.takes_level
    # a switch without tags in the template: the model writes <think> tags all the same
    granite = "{% if thinking %}Think first.{% endif %}{{ messages[0].content }}"
    style = thinking_style(granite)
    assert style is not None and style.tags == ("<think>", "</think>")
    assert style.switches == {"thinking"}
    # reading a message's own field is no switch; no tags and no switch: no thinking
    assert thinking_style("{% for m in messages %}{{ m.thinking }}{% endfor %}") is None
    assert thinking_style(CHATML_NO_TOOLS) is None
    assert thinking_style(None) is None
    assert starts_thinking("<|im_start|>assistant\n<think>\n", "<think>")
    assert not starts_thinking("assistant\n<think>\n\n</think>\n\n", "<think>")
    assert not starts_thinking("", "<think>")


def test_call_ids() -> None:
    ids = {new_call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(i.startswith("call_") and len(i) == 13 and i[5:].isalnum() for i in ids)


# --- grammars --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab(tiny_gguf: Path) -> Iterator[Any]:
    """The tiny model's vocabulary (byte-level: any text tokenizes), loaded by llama.cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(tiny_gguf).encode(), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


def _accepts(vocab: Any, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler lets the tokens of ``text`` through, and then
    the end of generation (so the grammar is complete there). Each token is checked with
    ``apply`` before it is accepted: accepting a refused token would abort the process."""
    import ctypes

    import llama_cpp

    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, f"llama.cpp refused the grammar:\n{grammar}"
    data = text.encode()
    buffer = (llama_cpp.llama_token * (len(data) + 8))()
    count = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, len(buffer), False, False)
    assert count > 0
    try:
        for token in [*buffer[:count], llama_cpp.llama_vocab_eos(vocab)]:
            candidate = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 1.0, 0))
            array = llama_cpp.llama_token_data_array(candidate, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if candidate[0].logit == float("-inf"):
                return False
            if token != llama_cpp.llama_vocab_eos(vocab):
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


GRAMMAR_CASES = {
    "hermes": (
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": 5}}\n</tool_call>',
        HermesParser,
    ),
    "qwen3-coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=town>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        Qwen3CoderParser,
    ),
    "llama3": (
        '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}',
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
        Llama3Parser,
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]',
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": null}}]',
        MistralParser,
    ),
    "mistral-args": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}',
        '[TOOL_CALLS]get_weather[ARGS]{"days": 1}',  # city is required
        MistralParser,
    ),
    "granite": (
        '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "CET"}}]',
        '<|tool_call|>[{"name": "set_time", "arguments": {}}]',
        GraniteParser,
    ),
    "json": (
        '{"name": "get_time", "arguments": {"zone": "CET"}}',
        '{"name": "get_time"}',
        GenericJsonParser,
    ),
    "harmony": (
        '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "X"}',
        "<|channel|>analysis<|message|>hmm",
        HarmonyParser,
    ),
}


@pytest.mark.parametrize("family", sorted(GRAMMAR_CASES))
def test_grammar_accepts_calls_and_refuses_others(family: str, vocab: Any) -> None:
    """Every grammar is parsed by llama.cpp itself, lets a valid call through (which the
    family's parser reads back), and refuses a malformed one."""
    good, bad, parser = GRAMMAR_CASES[family]
    grammar = tool_call_grammar(family, TOOLS, parallel=False)
    assert _accepts(vocab, grammar, good)
    assert not _accepts(vocab, grammar, bad)
    assert _run(lambda: parser(TOOLS), [good]).calls  # type: ignore[operator]
    for name in (None, "get_time"):
        forced = tool_call_grammar(family, TOOLS, name=name, parallel=True)
        assert _accepts(vocab, forced, good) is (name is None or "get_time" in good)
        if name:
            assert "get_weather" not in forced


def test_parallel_grammar_takes_several_calls(vocab: Any) -> None:
    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    two = one + "\n" + one
    assert _accepts(vocab, tool_call_grammar("hermes", TOOLS), two)
    assert not _accepts(vocab, tool_call_grammar("hermes", TOOLS, parallel=False), two)


def test_grammar_for_unknown_tool_name() -> None:
    from localllm.daemon.toolcalls import ToolGrammarError

    with pytest.raises(ToolGrammarError):
        tool_call_grammar("hermes", TOOLS, name="missing")


def test_lazy_triggers() -> None:
    import re

    (pattern,) = lazy_triggers("hermes")
    match = re.fullmatch(pattern, 'Let me check. <tool_call>\n{"name"')
    assert match is not None and match.group(1) == "<tool_call>"
    assert lazy_triggers("llama3") == []


def test_arguments_keep_key_order() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"z": 1, "a": 2, "m": 3}}</tool_call>'
    (call,) = _run(lambda: HermesParser(TOOLS), [text]).calls
    assert list(call.arguments) == ["z", "a", "m"]
    assert json.dumps(call.arguments) == '{"z": 1, "a": 2, "m": 3}'


# --- cut and malformed calls ----------------------------------------------------------------

# family: (parser, a complete call, what separates two calls, a second call to cut)
CUT_CASES = {
    "hermes": (
        HermesParser,
        QWEN_ONE,
        "\n",
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
    ),
    "qwen3-coder": (
        Qwen3CoderParser,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        "\n",
        "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n"
        "</tool_call>",
    ),
    "llama3": (
        Llama3Parser,
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        "; ",
        '{"name": "get_time", "parameters": {"zone": "UTC"}}',
    ),
    "llama3-tag": (
        Llama3Parser,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        "; ",
        '{"name": "get_time", "parameters": {"zone": "UTC"}}',
    ),
    "mistral": (
        MistralParser,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        "",
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]',
    ),
    "mistral-args": (
        MistralParser,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}',
        "",
        '[TOOL_CALLS]get_time[CALL_ID]abc123XYZ[ARGS]{"zone": "UTC"}',
    ),
    "granite": (
        GraniteParser,
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        "\n",
        '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "CET"}}]',
    ),
    "json": (
        GenericJsonParser,
        '{"name": "get_weather", "arguments": {"city": "Rome"}}',
        "\n",
        '{"name": "get_time", "arguments": {"zone": "CET"}}',
    ),
    "harmony": (
        HarmonyParser,
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Oslo"}<|call|>',
        "",
        "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
        '<|message|>{"zone": "UTC"}<|call|>',
    ),
}
MARKUP = ("<tool", "</tool", "<|", "[TOOL", "[ARGS]", "{", "<function", "<parameter")


@pytest.mark.parametrize("family", sorted(CUT_CASES))
def test_a_call_cut_by_the_token_limit_is_dropped_and_reported(family: str) -> None:
    """Wherever the limit cuts the second call, the first is parsed, the second never shows
    as content, and the answer says a call was cut (or has both when nothing was left)."""
    parser, first, separator, second = CUT_CASES[family]
    whole = _run(lambda: parser(TOOLS), [first + separator + second])
    assert len(whole.calls) == 2 and not whole.cut and not whole.content.strip()
    for k in range(1, len(second)):
        text = first + separator + second[:k]
        for pieces in ([text], [text[: len(first)], text[len(first) :]]):
            out = _run(lambda: parser(TOOLS), pieces, cut=True)
            assert not any(marker in out.content for marker in MARKUP), (k, out)
            assert out.calls[:1] == whole.calls[:1], (k, out)
            # the start of a closing marker after a whole call is that marker, not a cut
            closing = any(c.startswith(second[:k].strip()) for c in ("</tool", "<|/tool"))
            allowed = ((1, True), (2, False), (1, False)) if closing else ((1, True), (2, False))
            assert (len(out.calls), out.cut) in allowed, (k, out)


MALFORMED = {
    "hermes": (
        HermesParser,
        'Ok.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": }}\n</tool_call>',
    ),
    "hermes-not-a-call": (HermesParser, 'Ok.\n<tool_call>\n{"zone": "UTC"}\n</tool_call>'),
    "qwen3-coder": (Qwen3CoderParser, "Ok.\n<tool_call>\n<function=>\n</function>\n</tool_call>"),
    "mistral": (MistralParser, 'Ok.[TOOL_CALLS][{"name": "get_time", "arguments": [1}]'),
    "mistral-args": (MistralParser, 'Ok.[TOOL_CALLS]get_time[ARGS]{"zone": UTC}'),
    "granite": (GraniteParser, 'Ok.<|tool_call|>[{"arguments": {}}]'),
    "llama3-tag": (Llama3Parser, 'Ok.<|python_tag|>{"name": 5}'),
    "harmony": (
        HarmonyParser,
        "<|channel|>final<|message|>Ok.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_time <|constrain|>json<|message|>{zone: UTC}<|call|>",
    ),
}


@pytest.mark.parametrize("family", sorted(MALFORMED))
def test_malformed_call_markup_is_dropped_never_content(family: str) -> None:
    parser, text = MALFORMED[family]
    for pieces in _splits(text):
        out = _run(lambda: parser(TOOLS), pieces)
        assert out.content == "Ok.", (pieces, out)
        assert not out.calls and out.dropped and not out.cut, (pieces, out)


def test_an_opener_the_output_ends_on_is_prose_unless_cut() -> None:
    for parser, text in ((MistralParser, "Write [TOOL_CALLS]"), (HermesParser, "a <tool_call>")):
        assert _run(lambda p=parser: p(TOOLS), [text]).content == text  # type: ignore[misc]
        cut = _run(lambda p=parser: p(TOOLS), [text], cut=True)  # type: ignore[misc]
        assert cut.cut and "[TOOL" not in cut.content and "<tool" not in cut.content


def test_strict_json_grammar_refuses_raw_control_characters(vocab: Any) -> None:
    """A string in a call may hold an escaped newline, never a raw one (JSON forbids it; the
    forced call that held one could not be parsed)."""
    grammar = tool_call_grammar("hermes", TOOLS, name="get_weather", parallel=False)
    escaped = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a\\nb"}}\n</tool_call>'
    raw = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a\nb"}}\n</tool_call>'
    assert _accepts(vocab, grammar, escaped)
    assert not _accepts(vocab, grammar, raw)
    assert _run(lambda: HermesParser(TOOLS), [escaped]).calls == [
        ToolCall("get_weather", {"city": "a\nb"})
    ]
