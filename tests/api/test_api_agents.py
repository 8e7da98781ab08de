"""What editors and agents send beyond plain chat, end to end: a real daemon, tiny models and
the official ``ollama`` and ``openai`` clients.

Covered: ``think`` / ``reasoning_effort`` on a template with reasoning switches (the reasoning
split out as ``thinking`` / ``reasoning_content``), log probabilities in both families'
shapes, ``n`` choices, ``logit_bias``, a lazy tool-call grammar for ``tool_choice: auto``,
``/api/generate``'s ``context`` and ``shift``, llama-server's ``/tokenize``, ``/detokenize``
and ``/infill``.

The tiny models have random weights and ``never_ends``: their special tokens (end of turn,
``<think>``, ``<tool_call>``...) are never generated unless a request makes them so, which
keeps every answer's shape certain. Nothing asserts what a model says: only shapes,
properties (greedy picks the most likely token, counts add up), and streamed answers equal
to non-streamed ones of the same run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import openai
import pytest
import tiny_gguf
from test_api_tools import ASK, HERMES_TEMPLATE, TOOLS, _valid
from test_daemon_support import Daemon, running_daemon, wait_for_stats
from thinking_models import THINKER_TEMPLATE, write_with_special

from localllm.daemon.api.llamaserver import _EarlyStop

pytestmark = pytest.mark.slow

PLAIN = "tiny:plain"
THINKER = "tiny:thinker"
HERMES = "tiny:hermes"

HI = [{"role": "user", "content": "Hello there"}]
GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    models = tmp_path_factory.mktemp("models")
    with running_daemon(
        tmp_path_factory.mktemp("agents") / "home", num_parallel=2, num_threads=1
    ) as d:
        for name, template in (
            (PLAIN, tiny_gguf.CHATML_TEMPLATE),
            (THINKER, THINKER_TEMPLATE),
            (HERMES, HERMES_TEMPLATE),
        ):
            path = write_with_special(models / f"{name.split(':')[1]}.gguf", template)
            d.create(name, path)
        yield d


def _tokens(http: httpx.Client, model: str, text: str, **flags: Any) -> list[int]:
    response = http.post("/tokenize", json={"model": model, "content": text, **flags})
    assert response.status_code == 200, response.text
    return list(response.json()["tokens"])


def _extra(obj: Any, key: str) -> Any:
    """A field the openai SDK does not declare (``reasoning_content``)."""
    return (getattr(obj, "model_extra", None) or {}).get(key)


# --- capabilities -------------------------------------------------------------------------------


def test_capabilities(oll: ollama.Client) -> None:
    thinker = oll.show(THINKER).capabilities or []
    assert "thinking" in thinker and "completion" in thinker
    plain = oll.show(PLAIN).capabilities or []
    assert "thinking" not in plain and "tools" not in plain
    assert "insert" in plain  # the tiny vocabulary has fill-in-the-middle tokens
    assert "tools" in (oll.show(HERMES).capabilities or [])


# --- thinking -----------------------------------------------------------------------------------


def test_think_on_a_model_that_does_not_reason(oll: ollama.Client, oai: openai.OpenAI) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        oll.chat(model=PLAIN, messages=HI, think=True, options={"num_predict": 2})
    assert info.value.status_code == 400
    assert info.value.error == f'"{PLAIN}" does not support thinking'
    # asking it not to think is fine, and so is reasoning_effort none
    assert oll.chat(model=PLAIN, messages=HI, think=False, options={"num_predict": 2}).done
    oai.chat.completions.create(
        model=PLAIN,
        messages=HI,
        reasoning_effort="none",
        max_tokens=2,  # type: ignore[arg-type]
    )
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model=PLAIN, messages=HI, reasoning_effort="high", max_tokens=2)
    assert isinstance(refused.value.body, dict)
    assert refused.value.body.get("param") == "reasoning_effort"


def test_bad_think_values_are_400(http: httpx.Client) -> None:
    body = {"model": THINKER, "messages": HI, "think": "extreme", "stream": False}
    response = http.post("/api/chat", json=body)
    assert response.status_code == 400 and "think must be" in response.json()["error"]
    body = {"model": THINKER, "messages": HI, "reasoning_effort": "lots", "max_tokens": 2}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "reasoning_effort"


def test_ollama_think_splits_the_reasoning_out(oll: ollama.Client) -> None:
    options = {**GREEDY, "num_predict": 8}
    on = oll.chat(model=THINKER, messages=HI, think=True, options=options)
    # the template opened the block and the model never closes it: all of it is reasoning
    assert on.message.thinking and not on.message.content
    streamed = list(oll.chat(model=THINKER, messages=HI, think=True, options=options, stream=True))
    assert "".join(c.message.thinking or "" for c in streamed) == on.message.thinking
    assert "".join(c.message.content or "" for c in streamed) == ""
    off = oll.chat(model=THINKER, messages=HI, think=False, options=options)
    assert off.message.content and not off.message.thinking
    unset = oll.chat(model=THINKER, messages=HI, options=options)
    assert unset.message.thinking and not unset.message.content
    # the template's switch was set: off closes the block in the prompt
    assert (off.prompt_eval_count or 0) > (unset.prompt_eval_count or 0)
    # a level reaches the template (its reasoning_effort system line)
    low = oll.chat(model=THINKER, messages=HI, think="low", options=options)
    assert low.message.thinking
    assert low.prompt_eval_count != on.prompt_eval_count  # "low" vs true's "medium"
    generated = oll.generate(model=THINKER, prompt="Hello there", think=True, options=options)
    assert generated.thinking and not generated.response
    # reasoning switched off, a format constrains the output from its first token
    formatted = oll.chat(model=THINKER, messages=HI, format="json", think=False, options=options)
    assert formatted.message.content.startswith("{") and not formatted.message.thinking
    assert (formatted.prompt_eval_count or 0) == off.prompt_eval_count


def test_reasoning_budget_and_a_format_after_the_reasoning(http: httpx.Client) -> None:
    """A budget closes the reasoning where it runs out (the close tag is inserted, as
    llama-server does) and the answer follows; with a format, the grammar constrains the
    answer after the close tag, so the model reasons and answers JSON."""
    from test_fault_support import is_json_prefix

    def chat(**extra: Any) -> dict[str, Any]:
        body = {"model": THINKER, "messages": HI, "stream": False, "think": True, **extra}
        response = http.post("/api/chat", json=body)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    def reasoning(tokens: int) -> str:
        # Asked twice: the reference is then computed from the cached prompt, as the requests
        # it is compared with are (a prompt evaluated in one batch and one reused from the
        # cache can differ in the last bits of a logit, enough to flip a greedy near-tie).
        for _ in range(2):
            answer = chat(options={**GREEDY, "num_predict": tokens})
        return str(answer["message"]["thinking"])

    budget = 4
    # greedy: the budgeted reasoning is the first tokens of a reasoning cut at that length
    first = {"message": {"thinking": reasoning(budget), "content": ""}}
    assert first["message"]["thinking"] and not first["message"]["content"]
    budgeted = chat(options={**GREEDY, "num_predict": 24, "thinking_budget": budget})
    assert budgeted["message"]["thinking"] == first["message"]["thinking"]
    assert budgeted["thinking_budget_exhausted"] is True
    assert budgeted["eval_count"] > budget  # the answer went on after the inserted close tag
    for stream in (False, True):
        body = {"format": "json", "options": {**GREEDY, "num_predict": 40, "thinking_budget": 3}}
        if stream:
            whole = {"model": THINKER, "messages": HI, "think": True, **body}
            response = http.post("/api/chat", json=whole)
            lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
            thinking = "".join(line["message"].get("thinking", "") for line in lines)
            content = "".join(line["message"]["content"] for line in lines)
            final = lines[-1]
        else:
            final = chat(**body)
            thinking, content = final["message"]["thinking"], final["message"]["content"]
        assert thinking == reasoning(3)
        assert content.startswith("{"), content  # the grammar took over after the close tag
        if final["done_reason"] == "stop":
            assert isinstance(json.loads(content), dict)
        else:
            assert is_json_prefix(content)


def test_openai_reasoning_content(oai: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": THINKER, "messages": HI, "max_tokens": 8, "temperature": 0}
    whole = oai.chat.completions.create(reasoning_effort="high", **kwargs)
    message = whole.choices[0].message
    reasoning = _extra(message, "reasoning_content")
    assert reasoning and not message.content
    parts = []
    for chunk in oai.chat.completions.create(reasoning_effort="high", stream=True, **kwargs):
        for choice in chunk.choices:
            parts.append(_extra(choice.delta, "reasoning_content") or "")
            assert not choice.delta.content
    assert "".join(parts) == reasoning
    plain = oai.chat.completions.create(reasoning_effort="none", **kwargs)
    assert plain.choices[0].message.content
    assert not _extra(plain.choices[0].message, "reasoning_content")
    # llama-server's switch does the same, and history reasoning is accepted
    history = [*HI, {"role": "assistant", "content": "Hi", "reasoning_content": "greet"}, *HI]
    switched = oai.chat.completions.create(
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        **{**kwargs, "messages": history},
    )
    assert switched.choices[0].message.content


def test_curl_style_think(http: httpx.Client) -> None:
    body = {"model": THINKER, "prompt": "hi", "think": True, "stream": False}
    body["options"] = {"num_predict": 4}
    response = http.post(
        "/api/generate",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["thinking"]


# --- log probabilities --------------------------------------------------------------------------


def _check_greedy_entry(token: str, logprob: float, top: list[Any], count: int) -> None:
    assert logprob <= 0
    assert len(top) == count
    values = [t.logprob if hasattr(t, "logprob") else t["logprob"] for t in top]
    assert values == sorted(values, reverse=True)
    # greedy without penalties picks the most likely token, the first alternative
    first = top[0].token if hasattr(top[0], "token") else top[0]["token"]
    assert first == token and values[0] == pytest.approx(logprob, abs=1e-4)


def test_ollama_logprobs(oll: ollama.Client, http: httpx.Client) -> None:
    options = {**GREEDY, "num_predict": 6}
    whole = oll.generate(model=PLAIN, prompt="hi", logprobs=True, top_logprobs=3, options=options)
    entries = whole.logprobs or []
    assert len(entries) == whole.eval_count == 6
    for entry in entries:
        _check_greedy_entry(entry.token, entry.logprob, entry.top_logprobs or [], 3)
    streamed = []
    for chunk in oll.generate(
        model=PLAIN, prompt="hi", logprobs=True, top_logprobs=3, options=options, stream=True
    ):
        streamed += chunk.logprobs or []
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in entries
    ]
    # the raw shape: bytes, and no top_logprobs unless asked for
    raw = http.post(
        "/api/chat",
        json={
            "model": PLAIN,
            "messages": HI,
            "logprobs": True,
            "stream": False,
            "options": options,
        },
    ).json()
    assert len(raw["logprobs"]) == raw["eval_count"]
    assert all("top_logprobs" not in e for e in raw["logprobs"])
    assert all(0 <= b <= 255 for e in raw["logprobs"] for b in e["bytes"])
    too_many = http.post("/api/generate", json={"model": PLAIN, "prompt": "hi", "top_logprobs": 21})
    assert too_many.status_code == 400 and "top_logprobs" in too_many.json()["error"]


def test_openai_chat_logprobs(oai: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": PLAIN, "messages": HI, "max_tokens": 5, **GREEDY}
    kwargs.pop("repeat_penalty")
    kwargs["frequency_penalty"] = 0
    whole = oai.chat.completions.create(logprobs=True, top_logprobs=2, **kwargs)
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and whole.usage is not None
    assert len(content) == whole.usage.completion_tokens == 5
    streamed = []
    for chunk in oai.chat.completions.create(logprobs=True, top_logprobs=2, stream=True, **kwargs):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed += choice.logprobs.content or []
    assert [e.token for e in streamed] == [e.token for e in content]
    for entry in content:
        assert entry.bytes is not None and len(entry.top_logprobs) == 2
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(top_logprobs=2, **kwargs)
    assert isinstance(info.value.body, dict) and info.value.body.get("param") == "top_logprobs"
    assert whole.choices[0].logprobs is not None
    assert oai.chat.completions.create(**kwargs).choices[0].logprobs is None


def test_legacy_completion_logprobs(oai: openai.OpenAI) -> None:
    whole = oai.completions.create(
        model=PLAIN, prompt="Once", max_tokens=5, temperature=0, logprobs=2
    )
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and whole.usage is not None
    tokens = logprobs.tokens or []
    assert len(tokens) == len(logprobs.token_logprobs or []) == whole.usage.completion_tokens
    offsets = logprobs.text_offset or []
    assert offsets == sorted(offsets) and offsets[0] == 0
    for token, alternatives in zip(tokens, logprobs.top_logprobs or [], strict=True):
        assert token in alternatives and len(alternatives) <= 3
    # echoed: the prompt's tokens first (the first one has no probability), then the answer's
    echoed = oai.completions.create(
        model=PLAIN, prompt="Once", max_tokens=5, temperature=0, logprobs=2, echo=True
    )
    scored = echoed.choices[0].logprobs
    assert scored is not None and echoed.choices[0].text == "Once" + whole.choices[0].text
    assert scored.token_logprobs is not None and scored.token_logprobs[0] is None
    assert (scored.tokens or [])[-len(tokens) :] == tokens


# --- n choices, logit_bias ----------------------------------------------------------------------


def test_n_choices(oai: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": PLAIN, "messages": HI, "max_tokens": 5, "temperature": 0}
    whole = oai.chat.completions.create(n=2, **kwargs)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.usage is not None and whole.usage.completion_tokens == 10
    # the same prompt, greedy: both choices are the same text
    texts = [c.message.content for c in whole.choices]
    assert texts[0] == texts[1]
    parts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    usage = None
    for chunk in oai.chat.completions.create(
        n=2, stream=True, stream_options={"include_usage": True}, **kwargs
    ):
        if not chunk.choices:
            usage = chunk.usage
        for choice in chunk.choices:
            parts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    assert parts == {0: texts[0], 1: texts[1]}
    assert finishes == {0: ["length"], 1: ["length"]}
    assert usage is not None and usage.completion_tokens == 10
    seeded = oai.completions.create(
        model=PLAIN, prompt="Once", max_tokens=4, temperature=0.9, seed=7, n=3
    )
    assert sorted(c.index for c in seeded.choices) == [0, 1, 2]
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(n=17, **kwargs)
    assert isinstance(info.value.body, dict) and info.value.body.get("param") == "n"


def test_n_choices_end_when_the_client_leaves(daemon: Daemon, http: httpx.Client) -> None:
    """A streamed answer of n choices whose reader goes away frees every choice's slot,
    including one still waiting for a slot (n above the daemon's 2 slots)."""
    body = {"model": PLAIN, "messages": HI, "n": 3, "max_tokens": 4000, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            seen += line.startswith("data: ")
            if seen == 4:
                break

    def idle(snapshot: dict[str, Any]) -> bool:
        models = [m for m in snapshot["models"] if m["name"].startswith(PLAIN)]
        return (
            bool(models)
            and all(m["active_requests"] == 0 and m["queued_requests"] == 0 for m in models)
            and snapshot["queue_depth"] == 0
        )

    wait_for_stats(daemon, idle)


def test_logit_bias(oai: openai.OpenAI, http: httpx.Client) -> None:
    (q,) = _tokens(http, PLAIN, "Q")
    forced = oai.completions.create(
        model=PLAIN, prompt="Once", max_tokens=3, temperature=0, logit_bias={str(q): 100}
    )
    assert forced.choices[0].text == "QQQ"
    chat = oai.chat.completions.create(
        model=PLAIN, messages=HI, max_tokens=3, temperature=0, logit_bias={str(q): 100}
    )
    assert chat.choices[0].message.content == "QQQ"
    for bias, param in (({"x": 1}, "logit_bias"), ({str(q): 101}, f"logit_bias.{q}")):
        body = {"model": PLAIN, "prompt": "Once", "max_tokens": 2, "logit_bias": bias}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    body = {"model": PLAIN, "prompt": "Once", "max_tokens": 2, "logit_bias": {"999999": 1}}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400 and "999999" in response.json()["error"]["message"]


# --- tools: the lazy grammar for tool_choice auto -----------------------------------------------


def _stream_calls(oai: openai.OpenAI, **kwargs: Any) -> tuple[list[tuple[str, Any]], str]:
    calls: dict[int, dict[str, str]] = {}
    finish = ""
    for chunk in oai.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"name": "", "arguments": ""})
                if part.function is not None:
                    call["name"] += part.function.name or ""
                    call["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())], finish


def test_lazy_grammar_keeps_an_auto_call_valid(oai: openai.OpenAI, http: httpx.Client) -> None:
    """tool_choice auto: the model is free until it opens a call (here made certain with a
    logit bias on the <tool_call> token); from there the lazy grammar keeps the call valid
    for the schema, where the random model alone would write garbage."""
    (opener,) = _tokens(http, HERMES, "<tool_call>", parse_special=True)
    kwargs: dict[str, Any] = {
        "model": HERMES,
        "messages": ASK,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 150,
        "parallel_tool_calls": False,
        "logit_bias": {str(opener): 100},
    }
    whole = oai.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    arguments = json.loads(call.function.arguments)
    assert _valid(call.function.name, arguments)
    assert not choice.message.content
    streamed, finish = _stream_calls(oai, **kwargs)
    assert finish == "tool_calls"
    assert streamed == [(call.function.name, arguments)]


# --- /api/generate context and shift ------------------------------------------------------------


def test_generate_context_in_and_out(http: httpx.Client) -> None:
    options = {**GREEDY, "num_predict": 4}
    first = http.post(
        "/api/generate", json={"model": PLAIN, "prompt": "hi", "stream": False, "options": options}
    ).json()
    context = first["context"]
    assert len(context) == first["prompt_eval_count"] + first["eval_count"]
    follow = {"model": PLAIN, "prompt": "more", "context": context, "options": options}
    second = http.post("/api/generate", json={**follow, "stream": False}).json()
    assert second["prompt_eval_count"] > len(context)
    assert second["context"][: len(context)] == context
    lines = [json.loads(line) for line in http.post("/api/generate", json=follow).iter_lines()]
    assert lines[-1]["done"] and lines[-1]["context"] == second["context"]
    assert "".join(line.get("response", "") for line in lines) == second["response"]
    for bad, param in (({"context": [-1]}, "context"), ({"suffix": "x"}, "context")):
        response = http.post("/api/generate", json={**follow, **bad, "stream": False})
        assert response.status_code == 400, response.text
        assert param in response.json()["error"] or "token" in response.json()["error"]
    raw = http.post(
        "/api/generate",
        json={"model": PLAIN, "prompt": "hi", "raw": True, "stream": False, "options": options},
    ).json()
    assert "context" not in raw  # as Ollama: a raw prompt has no turn to continue


def test_shift_false_ends_at_the_context(http: httpx.Client) -> None:
    options = {"temperature": 0, "num_ctx": 64}
    body = {"model": PLAIN, "prompt": "hi", "stream": False, "options": options}
    stopped = http.post("/api/generate", json={**body, "shift": False}).json()
    assert stopped["done_reason"] == "length"
    assert stopped["prompt_eval_count"] + stopped["eval_count"] <= 64
    shifted = http.post("/api/generate", json=body).json()
    assert shifted["eval_count"] > stopped["eval_count"]


# --- llama-server routes ------------------------------------------------------------------------


def test_tokenize_and_detokenize(http: httpx.Client) -> None:
    text = "hello world"
    tokens = _tokens(http, PLAIN, text)
    response = http.post("/detokenize", json={"model": PLAIN, "tokens": tokens})
    assert response.json() == {"content": text}
    pieces = http.post(
        "/tokenize", json={"model": PLAIN, "content": text, "with_pieces": True}
    ).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == text
    assert len(_tokens(http, PLAIN, "<|im_start|>", parse_special=True)) == 1
    assert len(_tokens(http, PLAIN, "<|im_start|>", parse_special=False)) > 1
    bad = http.post("/detokenize", json={"model": PLAIN, "tokens": [10**7]})
    assert bad.status_code == 400
    # curl -d style, no JSON content type
    curl = http.post(
        "/tokenize",
        content=json.dumps({"model": PLAIN, "content": text}).encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert curl.json()["tokens"] == tokens


def test_tokenize_without_a_model(http: httpx.Client) -> None:
    for loaded in http.get("/api/ps").json()["models"]:
        http.post("/api/generate", json={"model": loaded["name"], "keep_alive": 0})
    response = http.post("/tokenize", json={"content": "hi"})
    assert response.status_code == 400 and "model" in response.json()["error"]
    http.post("/api/generate", json={"model": PLAIN})  # load it: the one loaded model
    assert http.post("/tokenize", json={"content": "hi"}).json()["tokens"] == _tokens(
        http, PLAIN, "hi"
    )


INFILL = {
    "model": PLAIN,
    "input_prefix": "def f(x):\n    ",
    "input_suffix": "\n    return y\n",
    "n_predict": 6,
    "temperature": 0,
}


def test_infill(http: httpx.Client) -> None:
    whole = http.post("/infill", json=INFILL).json()
    assert whole["stop"] is True and isinstance(whole["content"], str)
    assert whole["tokens_predicted"] == 6 and whole["stop_type"] == "limit"
    assert whole["truncated"] is False
    assert set(whole["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"}
    prefix, suffix = (
        _tokens(http, PLAIN, INFILL["input_prefix"]),
        _tokens(http, PLAIN, INFILL["input_suffix"]),
    )
    # FIM_PRE prefix FIM_SUF suffix FIM_MID
    assert whole["tokens_evaluated"] == len(prefix) + len(suffix) + 3
    extra = [{"filename": "a.py", "text": "import os\n"}]
    more = http.post("/infill", json={**INFILL, "input_extra": extra, "prompt": "y = "}).json()
    added = len(_tokens(http, PLAIN, "import os\n")) + len(_tokens(http, PLAIN, "y = "))
    assert more["tokens_evaluated"] == whole["tokens_evaluated"] + added
    events = []
    with http.stream("POST", "/infill", json={**INFILL, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    fields = ["content", "timings/prompt_n"]
    picked = http.post("/infill", json={**INFILL, "response_fields": fields}).json()
    assert set(picked) == set(fields)
    plugin = {"samplers": ["top_k", "top_p", "infill"], "top_k": 40, "top_p": 0.99}
    plugin |= {"n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000}
    assert http.post("/infill", json={**INFILL, **plugin}).status_code == 200
    bad = http.post("/infill", json={**INFILL, "samplers": ["bogus"]})
    assert bad.status_code == 400 and "samplers" in bad.json()["error"]


def test_infill_early_stops() -> None:
    stop = _EarlyStop(n_indent=4, t_max_predict_ms=-1)
    sent = "".join(stop.feed(c, 0.0) for c in "x = 1\n    y = 2\n  ")
    # a new line's indentation is held back until it is known
    assert not stop.stopped and sent == "x = 1\n    y = 2\n"
    sent += "".join(stop.feed(c, 0.0) for c in "z = 3\n    w\n")
    # a line indented less ends it (cut after the indentation, as llama-server cuts)
    assert stop.stopped and sent == stop.text == "x = 1\n    y = 2\n  "
    assert stop.rest() == ""
    deep = _EarlyStop(n_indent=2, t_max_predict_ms=-1)
    text = "a\n  b\n    c\n"
    assert "".join(deep.feed(c, 0.0) for c in text) + deep.rest() == text
    assert not deep.stopped
    timed = _EarlyStop(n_indent=0, t_max_predict_ms=10)
    timed.feed("a", 0.0)
    timed.feed("b", 0.05)
    assert not timed.stopped  # no newline yet
    timed.feed("\n", 0.051)
    assert timed.stopped
