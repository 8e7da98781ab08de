"""The API layer's tool handling on real models in a real store (no daemon): which template
counts, tool_choice, and the call ids Mistral templates insist on."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_gguf import write_tiny_gguf

from localllm.daemon.api.tooling import (
    AnswerStream,
    parse_think,
    reasoning_effort_think,
    split_output,
)
from localllm.daemon.engine.reasoning import grammar_after
from localllm.daemon.errors import HTTPProblem
from localllm.daemon.prompt.chat import chat_template
from localllm.daemon.prompt.history import history_tool_calls, map_call_id
from localllm.daemon.prompt.thinking import ThinkPlan, plan_thinking
from localllm.daemon.prompt.tools import plan_tools, supports_tools
from localllm.daemon.runner.protocol import GenerationRequest
from localllm.daemon.toolcalls import thinking_style
from localllm.store.models import create_model, load_model
from localllm.store.store import Store

MISTRAL_TEMPLATE = (
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "{% if c.id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric "
    "strings with length 9!') }}{% endif %}[TOOL_CALLS]{{ c.function.name }}[ARGS]"
    "{{ c.function.arguments | tojson }}{% endfor %}{% else %}[INST]{{ m.content }}[/INST]"
    "{% endif %}{% endfor %}"
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _model(store: Store, tmp_path: Path, name: str, template: str | None) -> object:
    path = write_tiny_gguf(tmp_path / f"{name}.gguf", chat_template=template)
    create_model(store, f"{name}:latest", gguf_file=path)
    return load_model(store, f"{name}:latest")


def test_modelfile_template_overrides_the_gguf(store: Store, tmp_path: Path) -> None:
    plain = _model(store, tmp_path, "plain", None)
    assert not supports_tools(plain)  # type: ignore[arg-type]
    path = write_tiny_gguf(tmp_path / "base.gguf")
    create_model(store, "withtools:latest", gguf_file=path, template=MISTRAL_TEMPLATE)
    model = load_model(store, "withtools:latest")
    assert chat_template(model).effective == MISTRAL_TEMPLATE
    assert supports_tools(model)
    # an Ollama Go template cannot be rendered: the GGUF's own template is the one that counts
    create_model(store, "gotemplate:latest", base="withtools", template="{{ .Prompt }}")
    go = load_model(store, "gotemplate:latest")
    assert chat_template(go).effective == go.info.chat_template


def test_mistral_call_ids(store: Store, tmp_path: Path) -> None:
    model = _model(store, tmp_path, "mistral", MISTRAL_TEMPLATE)
    chat = chat_template(model)  # type: ignore[arg-type]
    plan = plan_tools(chat, [TOOL])
    assert plan is not None and plan.mistral_ids
    parsed = split_output(plan, '[TOOL_CALLS]f[ARGS]{"a": 1}')
    (call,) = parsed.calls
    new_id = plan.call_id(call)
    assert len(new_id) == 9 and new_id.isalnum()
    # ids from other clients become 9 characters, the same each time
    mapped = map_call_id("call_k3j9x0ab", plan)
    assert len(mapped) == 9 and mapped.isalnum() and mapped == map_call_id("call_k3j9x0ab", plan)
    assert map_call_id("abcDEF123", plan) == "abcDEF123"
    history = history_tool_calls(
        [{"id": "call_k3j9x0ab", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        "messages[1].tool_calls",
        plan,
    )
    assert history == [
        {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}, "id": mapped}
    ]


def test_tool_choice_rules(store: Store, tmp_path: Path) -> None:
    model = _model(store, tmp_path, "mistral2", MISTRAL_TEMPLATE)
    chat = chat_template(model)  # type: ignore[arg-type]
    assert plan_tools(chat, [TOOL], tool_choice="none") is None
    assert plan_tools(chat, None) is None
    with pytest.raises(HTTPProblem) as info:
        plan_tools(chat, [], tool_choice="auto")
    assert info.value.param == "tool_choice"
    required = plan_tools(chat, [TOOL], tool_choice="required")
    assert required is not None and required.grammar is not None
    assert "[TOOL_CALLS]f[ARGS]" in required.grammar  # the template's [ARGS] syntax
    # auto: the same grammar, lazy: it waits for the family's call opener
    auto = plan_tools(chat, [TOOL])
    assert auto is not None and auto.grammar is None
    assert auto.lazy_grammar == required.grammar
    assert auto.triggers == [r"^[\s\S]*?(\[TOOL_CALLS\])[\s\S]*"]
    # a format constrains the whole output already: no lazy grammar then
    formatted = plan_tools(chat, [TOOL], constrained_output=True)
    assert formatted is not None and formatted.lazy_grammar is None and not formatted.triggers
    off = plan_tools(chat, [TOOL, {**TOOL, "function": {"name": "g"}}], parallel=False)
    assert off is not None
    two = split_output(off, "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{}")
    assert [c.name for c in two.calls] == ["f"]


def test_no_tool_template_refuses_unless_none(store: Store, tmp_path: Path) -> None:
    model = _model(store, tmp_path, "chatml", "{% for m in messages %}{{ m.content }}{% endfor %}")
    chat = chat_template(model)  # type: ignore[arg-type]
    with pytest.raises(HTTPProblem) as info:
        plan_tools(chat, [TOOL])
    assert info.value.status == 400 and "does not support tools" in info.value.message
    assert info.value.param == "tools"
    assert plan_tools(chat, [TOOL], tool_choice="none") is None


THINKER_TEMPLATE = (
    "{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (False, False),
        ("high", "high"),
        ("MAX", "max"),
        ("false", False),
    ],
)
def test_parse_think(value: object, expected: object) -> None:
    assert parse_think(value) == expected


@pytest.mark.parametrize("value", ["extreme", 3, [], {"a": 1}])
def test_parse_think_refuses_the_rest(value: object) -> None:
    with pytest.raises(HTTPProblem) as info:
        parse_think(value)
    assert info.value.status == 400 and info.value.param == "think"


def test_reasoning_effort_maps_as_ollama_does() -> None:
    assert reasoning_effort_think("none") is False
    assert reasoning_effort_think("minimal") == "low"
    assert reasoning_effort_think("xhigh") == "max"
    assert reasoning_effort_think(None) is None
    with pytest.raises(HTTPProblem) as info:
        reasoning_effort_think("lots")
    assert info.value.param == "reasoning_effort"


def test_think_plan_switches() -> None:
    style = thinking_style(THINKER_TEMPLATE)
    assert style is not None
    assert ThinkPlan(style, None).template_kwargs() == {}
    assert ThinkPlan(style, True).template_kwargs() == {
        "enable_thinking": True,
        "reasoning_effort": "medium",
    }
    assert ThinkPlan(style, "max").template_kwargs()["reasoning_effort"] == "high"
    assert ThinkPlan(style, False).template_kwargs() == {"enable_thinking": False}
    harmony = thinking_style("{{ reasoning_effort }}<|channel|>")
    assert harmony is not None
    # harmony cannot stop reasoning: off is its lowest level, and its reasoning is kept
    off = ThinkPlan(harmony, False)
    assert off.template_kwargs() == {"reasoning_effort": "low"} and off.keep


def test_answer_stream_thinking() -> None:
    style = thinking_style(THINKER_TEMPLATE)
    assert style is not None
    on = ThinkPlan(style, True)
    # the prompt opened the block: everything up to the close tag is reasoning
    parsed = AnswerStream(None, on, "question<think>\n").whole("hmm</think>\n\nAnswer")
    assert (parsed.thinking, parsed.content) == ("hmm", "Answer")
    pieces = AnswerStream(None, on, "")
    out = pieces.feed("<thi").add(pieces.feed("nk>a</th")).add(pieces.feed("ink>b"))
    out.add(pieces.finish())
    assert (out.thinking, out.content) == ("a", "b")
    # switched off: reasoning a model writes anyway is not reported
    off = AnswerStream(None, ThinkPlan(style, False), "")
    parsed = off.whole("<think>x</think>y")
    assert (parsed.thinking, parsed.content) == ("", "y")
    assert AnswerStream().whole("<think>x</think>").content == "<think>x</think>"


def test_plan_thinking_on_models(store: Store, tmp_path: Path) -> None:
    plain = _model(
        store, tmp_path, "plainchat", "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    chat = chat_template(plain)  # type: ignore[arg-type]
    with pytest.raises(HTTPProblem) as info:
        plan_thinking(chat, True)
    message = info.value.message
    assert message.startswith('"plainchat') and message.endswith('" does not support thinking')
    assert info.value.status == 400 and info.value.param == "think"
    assert plan_thinking(chat, False) is None
    assert plan_thinking(chat, None) is None
    with pytest.raises(HTTPProblem) as effort:
        plan_thinking(chat, "high", field="reasoning_effort")
    assert effort.value.param == "reasoning_effort"
    thinker = _model(store, tmp_path, "thinker", THINKER_TEMPLATE)
    thinking = chat_template(thinker)  # type: ignore[arg-type]
    plan = plan_thinking(thinking, "low")
    assert plan is not None and plan.template_kwargs()["reasoning_effort"] == "low"


def test_constrained_output_waits_for_the_reasoning_to_close() -> None:
    """A format (or a forced call) on a reasoning model: the model reasons first, and the
    grammar constrains the answer after the close tag (a lazy grammar it triggers); where the
    template closes the block itself (reasoning off) the runner applies it at once."""
    import re

    style = thinking_style(THINKER_TEMPLATE)
    assert style is not None
    request = GenerationRequest(id="")
    request.options.json_mode = True
    plan = ThinkPlan(style, None)
    plan.apply(request, budget=64)
    options = request.options
    assert request.template_kwargs == {} and request.render_special and not plan.constrained
    assert options.reasoning_tags == ["<think>", "</think>"] and options.reasoning_budget == 64
    # the runner makes the grammar lazy, triggered by the close tag (unless the prompt closed it)
    assert options.grammar_after_reasoning and options.grammar_triggers == []
    grammar, trigger = grammar_after('root ::= "{}"', "</think>")
    assert not re.fullmatch(trigger, "thinking about {}")
    match = re.fullmatch(trigger, "thinking</think>\n\n{")
    assert match is not None and match.group(1) == "</think>"  # what the grammar is fed first
    assert grammar.startswith('root ::= "</think>"') and "reasoned-answer ::= " in grammar
    parsed = AnswerStream(None, plan, "question<think>\n").whole('hmm</think>\n\n{"a": 1}')
    assert (parsed.content, parsed.thinking) == ('{"a": 1}', "hmm")
    # reasoning switched off: the output is constrained from its first token, and is the answer
    off = GenerationRequest(id="")
    off.options.json_mode = True
    plain = ThinkPlan(style, False)
    plain.apply(off, budget=64)
    assert off.template_kwargs == {"enable_thinking": False} and plain.constrained
    assert not off.options.grammar_after_reasoning and off.options.reasoning_budget == -1
    parsed = AnswerStream(None, plain, "question<think>\n").whole('{"a": 1}')
    assert (parsed.content, parsed.thinking) == ('{"a": 1}', "")


def test_lazy_call_grammar_waits_for_the_reasoning_to_close() -> None:
    import re

    from localllm.daemon.toolcalls import lazy_triggers

    style = thinking_style(THINKER_TEMPLATE)
    assert style is not None
    (trigger,) = lazy_triggers("hermes")

    def triggers(think: bool | str | None) -> list[str]:
        request = GenerationRequest(id="")
        request.options.grammar, request.options.grammar_triggers = "root ::= x", [trigger]
        ThinkPlan(style, think).apply(request)
        return request.options.grammar_triggers

    (waiting,) = triggers(True)
    assert triggers(None) == [waiting]
    pattern = re.compile(waiting)
    # a call opener written while reasoning does not start the grammar; one after it does
    assert not pattern.fullmatch("I could use <tool_call> here")
    match = pattern.fullmatch("I will call it.</think>\n\n<tool_call>\n{")
    assert match is not None and match.group(1) == "<tool_call>"
    # reasoning switched off in the template: the plain trigger
    assert triggers(False) == [trigger]


def test_go_templates_of_every_shape_are_never_sent_to_the_runner() -> None:
    from localllm.daemon.prompt.template import jinja_override

    for go in ("{{ .Prompt }}", "{{- if .System }}x{{ end }}", "{{ range .Messages }}y{{ end }}"):
        assert jinja_override(go) is None
    jinja = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert jinja_override(jinja) == jinja
