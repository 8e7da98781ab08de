"""The prompt room on real models in a real store (no daemon): one call plans a request's
prompt (template, tools, thinking), the tools' grammar is built once per tool set, and the
request's way through the planning stays short."""

from __future__ import annotations

import os
import sys
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from tiny_gguf import write_tiny_gguf

import localllm.daemon
from localllm.daemon.api import core
from localllm.daemon.api.core import Ask, Turn
from localllm.daemon.errors import HTTPProblem
from localllm.daemon.prompt.chat import chat_template
from localllm.daemon.prompt.plan import plan_prompt
from localllm.daemon.prompt.template import render_chat
from localllm.daemon.runner.protocol import SamplingOptions
from localllm.daemon.state import DaemonState
from localllm.settings import Settings
from localllm.store.models import LocalModel, create_model, load_model
from localllm.store.store import Store

# Qwen3-style: tools in a system turn, calls as <tool_call> JSON, reasoning switched by
# enable_thinking (the prompt opens the block when it is on).
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}"
    "{% endfor %}</tools>\nCalls: <tool_call>{...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{% endif %}{% endif %}"
)
PLAIN = "{% for message in messages %}{{ message.content }}\n{% endfor %}"
ZONE = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}


@pytest.fixture
def model(store: Store, tmp_path: Path) -> LocalModel:
    path = write_tiny_gguf(tmp_path / "thinker.gguf", chat_template=TEMPLATE)
    create_model(store, "thinker:latest", gguf_file=path)
    return load_model(store, "thinker:latest")


def _chat(model: LocalModel, **fields: Any) -> Ask:
    return Ask(model=model, api="ollama", turns=[Turn("user", "What time is it?")], **fields)


def test_one_call_plans_tools_and_thinking(model: LocalModel) -> None:
    sampling = SamplingOptions()
    plan = plan_prompt(_chat(model, tools=[ZONE], think=True), sampling)
    assert plan.tools is not None and plan.think is not None
    # the conversation and the tools go to the runner, which renders the GGUF's template
    assert plan.messages == [{"role": "user", "content": "What time is it?"}]
    assert plan.template is None and plan.text is None and not plan.raw
    assert plan.tool_definitions == [ZONE] and plan.render_special
    assert plan.template_kwargs == {"enable_thinking": True}
    # the grammar plan: the calls' lazy grammar, started only after the reasoning closed
    options = plan.options
    assert options.grammar == plan.tools.lazy_grammar is not None
    assert options.closed_triggers == plan.tools.triggers
    assert options.grammar_triggers and all("</think>" in t for t in options.grammar_triggers)
    assert options.reasoning_tags == ["<think>", "</think>"]
    # the caller's sampling options are left as they were
    assert sampling.grammar is None and not sampling.grammar_triggers
    # the parsers chosen read a reasoning block, then a call, out of the answer
    stream = core.AnswerStream(plan.tools, plan.think, "<|im_start|>assistant\n<think>\n")
    parsed = stream.whole('hm</think><tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert parsed.thinking == "hm" and [c.name for c in parsed.calls] == ["get_time"]


def test_the_request_template_variables_win(model: LocalModel) -> None:
    ask = _chat(model, think=False, template_kwargs={"enable_thinking": True})
    plan = plan_prompt(ask, SamplingOptions())
    assert plan.template_kwargs == {"enable_thinking": True}


def test_the_tools_grammar_is_built_once_per_tool_set(model: LocalModel) -> None:
    first = plan_prompt(_chat(model, tools=[ZONE]), SamplingOptions())
    again = plan_prompt(_chat(model, tools=[ZONE]), SamplingOptions())
    assert first.tools is not None and again.tools is not None
    assert again.tools.lazy_grammar is first.tools.lazy_grammar  # reused, not rebuilt
    other = {**ZONE, "function": {**ZONE["function"], "name": "get_zone"}}
    changed = plan_prompt(_chat(model, tools=[other]), SamplingOptions())
    assert changed.tools is not None and changed.tools.lazy_grammar != first.tools.lazy_grammar
    assert "get_zone" in (changed.tools.lazy_grammar or "")
    forced = plan_prompt(_chat(model, tools=[ZONE], tool_choice="required"), SamplingOptions())
    assert forced.tools is not None and forced.options.grammar == forced.tools.grammar
    assert not forced.options.grammar_triggers


def test_a_grammar_that_cannot_be_built_is_a_400_every_time(model: LocalModel) -> None:
    bad = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}},
        },
    }
    for _ in range(2):  # the second answer comes from the cache: the same 400
        with pytest.raises(HTTPProblem) as info:
            plan_prompt(_chat(model, tools=[bad], tool_choice="required"), SamplingOptions())
        assert info.value.status == 400 and info.value.param == "tools"
        assert "cannot build a grammar" in info.value.message


def test_a_continued_context_is_rendered_here(model: LocalModel) -> None:
    ask = Ask(model=model, api="ollama", prompt="And now?", system="Be brief.", context=[5, 6, 7])
    ask.think = False
    plan = plan_prompt(ask, SamplingOptions())
    expected = render_chat(
        TEMPLATE,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "And now?"}],
        extra={"enable_thinking": False},
    )
    assert plan.text == expected and plan.raw and plan.messages is None
    assert plan.context == [5, 6, 7] and plan.context is not ask.context


def test_raw_prompts_and_token_prompts_are_not_templated(model: LocalModel) -> None:
    raw = plan_prompt(Ask(model=model, api="ollama", prompt="x", raw=True), SamplingOptions())
    assert raw.text == "x" and raw.raw and raw.messages is None and raw.think is None
    ids = Ask(model=model, api="openai", prompt_tokens=[1, 2, 3])
    tokens = plan_prompt(ids, SamplingOptions())
    assert tokens.text == "" and tokens.raw and tokens.context == [1, 2, 3]


def _returns(state: DaemonState, ask: Ask) -> tuple[int, list[str]]:
    """How often planning ``ask`` comes back to a daemon module it had left (the module the
    innermost daemon frame belongs to, followed call by call and return by return)."""
    root = os.path.dirname(localllm.daemon.__file__) + os.sep
    stack: list[str] = []
    way: list[str] = []

    def follow(frame: FrameType, event: str, _: Any) -> None:
        name = frame.f_code.co_filename
        if event not in ("call", "return") or not name.startswith(root):
            return
        if event == "call":
            stack.append(name[len(root) :])
        elif stack:
            stack.pop()
        if stack and (not way or way[-1] != stack[-1]):
            way.append(stack[-1])

    sys.setprofile(follow)
    try:
        core.plan(state, ask)
    finally:
        sys.setprofile(None)
    return len(way) - len(set(way)), way


def test_a_requests_way_through_planning_stays_short(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    # issue 49: from plan() in api/core.py, a chat with tools and think came back 22 times
    # to a module it had left (api/core.py and api/tooling.py handing it back and forth)
    path = write_tiny_gguf(tmp_path / "thinker.gguf", chat_template=TEMPLATE)
    create_model(store, "thinker:latest", gguf_file=path)
    state = DaemonState.create(settings)
    model = load_model(state.store, "thinker:latest")
    core.plan(state, _chat(model, tools=[ZONE], think=True))  # an agent's first turn
    returns, way = _returns(state, _chat(model, tools=[ZONE], think=True))
    assert returns <= 12, " > ".join(way)
    assert "api/tooling.py" not in way  # the prompt is planned in the prompt room alone
    # the core hands the request to the prompt room once, and the room's entry is plan.py
    entries = [b for a, b in pairwise(way) if a == "api/core.py" and b.startswith("prompt/")]
    assert entries == ["prompt/plan.py"]
    # the template is read once, into a value the tools, the reasoning switch and the
    # conversation take: each is entered once, and none goes back to the template or the model
    for room in ("prompt/tools.py", "prompt/thinking.py", "prompt/history.py"):
        assert way.count(room) == 1, " > ".join(way)
    assert "prompt/template.py" not in way[way.index("prompt/tools.py") :], " > ".join(way)
    # the sampling options and the runner's load config are each decided in one pass
    assert way.count("options.py") == 1 and way.count("loadconfig.py") == 1, " > ".join(way)


def test_the_choices_share_one_load_config(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    path = write_tiny_gguf(tmp_path / "thinker.gguf", chat_template=TEMPLATE)
    create_model(store, "thinker:latest", gguf_file=path)
    state = DaemonState.create(settings)
    model = load_model(state.store, "thinker:latest")
    planned = core.plan(state, _chat(model, n=3, options={"num_ctx": 256}))
    first, *others = planned.jobs
    assert len(others) == 2 and first.config.n_ctx_per_slot == 256
    assert all(job.config is first.config for job in others)  # decided once, for all three
    assert len({id(job.request) for job in planned.jobs}) == 3  # each its own request


def test_the_request_template_counts_where_a_template_is_applied(
    store: Store, tmp_path: Path
) -> None:
    # a model that does not reason, asked with a template of a model that does
    path = write_tiny_gguf(tmp_path / "plain.gguf", chat_template=PLAIN)
    create_model(store, "plain:latest", gguf_file=path)
    model = load_model(store, "plain:latest")
    chat = chat_template(model, TEMPLATE)
    assert chat.rendered == TEMPLATE and chat.effective == PLAIN and chat.thinking is not None
    assert chat.family is None and not chat.takes_tools  # the tools' syntax is the model's own
    templated = Ask(model=model, api="ollama", prompt="Hi", template=TEMPLATE, think=True)
    plan = plan_prompt(templated, SamplingOptions())
    assert plan.think is not None and plan.template == TEMPLATE
    assert plan.template_kwargs == {"enable_thinking": True}
    # a raw prompt applies no template: the model's own says whether it reasons
    raw = Ask(model=model, api="ollama", prompt="Hi", template=TEMPLATE, think=True, raw=True)
    with pytest.raises(HTTPProblem) as info:
        plan_prompt(raw, SamplingOptions())
    assert info.value.status == 400 and "does not support thinking" in info.value.message
    # tools are checked against the model's own template, whatever the request renders with
    with pytest.raises(HTTPProblem) as tools:
        plan_prompt(_chat(model, tools=[ZONE], template=TEMPLATE), SamplingOptions())
    assert tools.value.param == "tools" and "does not support tools" in tools.value.message
