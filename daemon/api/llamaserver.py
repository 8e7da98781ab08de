"""llama-server's extra routes, for the editor plugins and tools written against it:
``/tokenize``, ``/detokenize`` and ``/infill`` (fill-in-the-middle code completion, what
llama.vim and llama.vscode call).

llama-server serves one model, so its clients send no ``model``: a request without one goes
to the model loaded now when exactly one is, else it is a 400 asking for ``model``. Errors
take the Ollama shape (``{"error": "..."}``) like the other routes outside ``/v1``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from localllm.store.models import OPTION_TYPES, LocalModel

from ..errors import ClientGone, HTTPProblem, problem_from
from ..generation import context_length, resolve_model, until_disconnect
from ..loadconfig import runner_config
from ..options import merge_options, named_options
from ..runner.protocol import SamplingOptions
from ..state import DaemonState, StateDep
from .core import Ask, Done, Reply, TextCut, plan
from .streaming import ClosingStreamingResponse, sse_event

__all__ = ["DetokenizeRequest", "InfillRequest", "TokenizeRequest", "router"]

router = APIRouter()

T = TypeVar("T")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(
        None, description="The model; optional when exactly one model is loaded."
    )


class TokenizeRequest(_Body):
    """POST /tokenize (llama-server)."""

    content: str
    add_special: bool = Field(False, description="Add BOS when the model wants one.")
    parse_special: bool = Field(
        True, description="Read special-token text (<|im_start|>) as those tokens."
    )
    with_pieces: bool = Field(False, description="Answer {id, piece} pairs instead of ids.")


class DetokenizeRequest(_Body):
    """POST /detokenize (llama-server)."""

    tokens: list[int]


class ExtraChunk(BaseModel):
    """One ``input_extra`` item: context from another file."""

    model_config = ConfigDict(extra="ignore")

    text: str = ""
    filename: str = ""


# llama-server's sampler names (also its one-letter string form).
_SAMPLER_LETTERS = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
    "s": "top_n_sigma",
    "i": "infill",
    "e": "penalties",
}
_SAMPLERS = set(_SAMPLER_LETTERS.values()) | {"typical_p"}


class InfillRequest(_Body):
    """POST /infill: llama-server's fill-in-the-middle request.

    Honoured: ``input_prefix``, ``input_suffix``, ``input_extra`` (placed before the prefix,
    as llama-server does, with the model's repo and file separator tokens when it has them),
    ``prompt`` (text after the middle token: what is typed on the cursor's line), the
    sampling options, ``n_predict``, ``stop``, ``n_indent`` and ``t_max_predict_ms`` (both stop
    a completion early, as llama-server does), ``samplers`` (the ones not named are switched
    off; the order is the engine's own, and the ``infill`` sampler has no equivalent here),
    ``response_fields``, ``stream``. ``cache_prompt`` is accepted: prompts are always reused
    from the cache here, which changes no output. ``t_max_prompt_ms`` is accepted and not
    enforced, exactly as llama-server accepts it (its server marks it "TODO"); plugins set it
    by default, and enforcing it would cut completions that llama-server gives in full.
    """

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""
    stream: bool = False
    n_predict: int | None = Field(None, ge=-1, le=1 << 24)
    max_tokens: int | None = Field(None, ge=-1, le=1 << 24, description="Alias of n_predict.")
    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    typical_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, ge=0)
    repeat_last_n: int | None = Field(None, ge=-1)
    penalty_last_n: int | None = Field(None, ge=-1, description="Alias of repeat_last_n.")
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    n_keep: int | None = Field(None, ge=-1)
    n_indent: int = Field(0, ge=0, description="Stop at a line indented less than this.")
    t_max_predict_ms: int = Field(
        -1, description="Stop once a newline was generated and this many ms have passed."
    )
    t_max_prompt_ms: int = Field(-1, description="Accepted, not enforced (as llama-server).")
    cache_prompt: bool = True
    samplers: list[str] | str | None = None
    response_fields: list[str] | None = None


def _default_model(state: DaemonState, name: str | None) -> LocalModel:
    """The model a request names, or the one loaded now when it names none."""
    if name:
        return resolve_model(state, name)
    loaded = state.scheduler.loaded()
    if len(loaded) == 1:
        return loaded[0].model
    raise HTTPProblem(
        400,
        "model is required: "
        + ("no model is loaded" if not loaded else "several models are loaded"),
        param="model",
    )


async def _with_runner(
    state: DaemonState,
    request: Request,
    model: LocalModel,
    work: Callable[[Any], Awaitable[T]],
) -> T:
    """Run ``work(runner)`` holding a slot of ``model``'s runner (loading it if needed), as
    the daemon's own token-array embeddings do."""
    config = runner_config(state.settings, model, merge_options(model, {}))

    async def run() -> T:
        lease = await state.scheduler.acquire(model, config, None)
        async with lease:
            return await work(lease.runner)

    try:
        return await until_disconnect(request, run())
    except (HTTPProblem, ClientGone):
        raise
    except Exception as exc:
        raise problem_from(exc, model.name.short) from exc


@router.post("/tokenize", summary="Tokenize text (llama-server)")
async def tokenize(body: TokenizeRequest, request: Request, state: StateDep) -> dict[str, Any]:
    """``{"tokens": [ids]}``, or with ``with_pieces`` ``{"tokens": [{"id", "piece"}]}`` (a
    piece that is part of a UTF-8 character shows as U+FFFD)."""
    model = _default_model(state, body.model)

    async def work(runner: Any) -> dict[str, Any]:
        tokens = await runner.tokenize(
            body.content, add_special=body.add_special, parse_special=body.parse_special
        )
        if not body.with_pieces:
            return {"tokens": tokens}
        pieces = [{"id": t, "piece": await runner.detokenize([t])} for t in tokens]
        return {"tokens": pieces}

    return await _with_runner(state, request, model, work)


@router.post("/detokenize", summary="Turn token ids into text (llama-server)")
async def detokenize(body: DetokenizeRequest, request: Request, state: StateDep) -> dict[str, Any]:
    """``{"content": text}``; ids outside the model's vocabulary are a 400."""
    model = _default_model(state, body.model)

    async def work(runner: Any) -> dict[str, Any]:
        return {"content": await runner.detokenize(body.tokens)}

    return await _with_runner(state, request, model, work)


# --- /infill ----------------------------------------------------------------------------------


def _metadata_int(model: LocalModel, key: str) -> int | None:
    value = model.info.metadata.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# The infill fields that mean what Ollama's option of the same name means (repeat_last_n has an
# alias and stop a default of its own: both are read below).
_SAME_AS_OLLAMA = tuple(
    key
    for key in InfillRequest.model_fields
    if key in OPTION_TYPES and key not in ("repeat_last_n", "stop")
)


def _infill_sampling(model: LocalModel, body: InfillRequest) -> tuple[dict[str, Any], int]:
    """Merged options and the n_predict of an infill request."""
    n_predict = body.n_predict if body.n_predict is not None else body.max_tokens
    overrides = named_options(body, _SAME_AS_OLLAMA, n_predict)
    last_n = body.repeat_last_n if body.repeat_last_n is not None else body.penalty_last_n
    if last_n is not None:
        overrides["repeat_last_n"] = last_n
    if body.n_keep is not None:
        overrides["num_keep"] = body.n_keep
    if body.stop:
        overrides["stop"] = body.stop
    options = merge_options(model, overrides, prefix="")
    return options, int(options.get("num_predict", -1))


def _apply_samplers(sampling: SamplingOptions, samplers: list[str] | str | None) -> None:
    """llama-server's ``samplers``: only the named samplers run, so the others are switched
    off here (a chain without ``temperature`` samples at temperature 1)."""
    if samplers is None:
        return
    if isinstance(samplers, str):
        unknown = [c for c in samplers if c not in _SAMPLER_LETTERS]
        names = {_SAMPLER_LETTERS.get(c, c) for c in samplers}
    else:
        unknown = [s for s in samplers if s not in _SAMPLERS]
        names = set(samplers)
    if unknown:
        raise HTTPProblem(
            400,
            f"samplers: unknown sampler {unknown[0]!r} (known: {', '.join(sorted(_SAMPLERS))})",
            param="samplers",
        )
    if "top_k" not in names:
        sampling.top_k = 0
    if "top_p" not in names:
        sampling.top_p = 1.0
    if "min_p" not in names:
        sampling.min_p = 0.0
    if not names & {"typ_p", "typical_p"}:
        sampling.typical_p = 1.0
    if "temperature" not in names:
        sampling.temperature = 1.0
    if "penalties" not in names:
        sampling.repeat_penalty = 1.0
        sampling.presence_penalty = 0.0
        sampling.frequency_penalty = 0.0


async def _infill_tokens(
    state: DaemonState,
    request: Request,
    model: LocalModel,
    body: InfillRequest,
    n_ctx: int,
    n_predict: int,
) -> tuple[list[int], bool]:
    """The prompt tokens of an infill request, laid out as llama-server's ``format_infill``
    does: [BOS] extra context, FIM_PRE prefix, FIM_SUF suffix, FIM_MID prompt. What does not
    fit goes first from the extra context's start, then from the prefix's start and the
    suffix's end (the text nearest the cursor stays). Returns (tokens, truncated)."""
    prefix_id = _metadata_int(model, "tokenizer.ggml.fim_pre_token_id")
    suffix_id = _metadata_int(model, "tokenizer.ggml.fim_suf_token_id")
    middle_id = _metadata_int(model, "tokenizer.ggml.fim_mid_token_id")
    if prefix_id is None or suffix_id is None or middle_id is None:
        raise HTTPProblem(
            400,
            f"{model.name.short} has no fill-in-the-middle tokens, so it cannot infill",
            param="model",
        )
    repo_id = _metadata_int(model, "tokenizer.ggml.fim_rep_token_id")
    separator_id = _metadata_int(model, "tokenizer.ggml.fim_sep_token_id")
    bos = _metadata_int(model, "tokenizer.ggml.bos_token_id")
    add_bos = model.info.metadata.get("tokenizer.ggml.add_bos_token") is True and bos is not None

    async def work(runner: Any) -> tuple[list[int], list[int], list[int], list[int]]:
        async def tok(text: str) -> list[int]:
            return list(await runner.tokenize(text)) if text else []

        extra: list[int] = []
        if repo_id is not None:
            extra += [repo_id, *await tok("myproject\n")]
        for chunk in body.input_extra:
            if separator_id is not None:
                extra += [separator_id, *await tok(chunk.filename + "\n")]
            extra += await tok(chunk.text)
        if separator_id is not None:
            extra += [separator_id, *await tok("filename\n")]
        return (
            extra,
            await tok(body.input_prefix),
            await tok(body.input_suffix),
            await tok(body.prompt),
        )

    extra, prefix, suffix, middle = await _with_runner(state, request, model, work)
    reserve = min(n_predict if n_predict > 0 else n_ctx // 4, n_ctx // 2)
    room = n_ctx - max(reserve, 1) - 3 - (1 if add_bos else 0) - len(middle)
    if room < 0:
        raise HTTPProblem(
            400,
            f"prompt is {len(middle)} tokens, more than fit in the context of {n_ctx} tokens",
            param="prompt",
            code="context_length_exceeded",
        )
    suffix_take = min(len(suffix), max(room // 4, room - len(prefix)))
    prefix_take = min(len(prefix), room - suffix_take)
    extra_take = min(len(extra), room - suffix_take - prefix_take)
    truncated = (suffix_take, prefix_take, extra_take) != (len(suffix), len(prefix), len(extra))
    tokens = [
        *([bos] if add_bos and bos is not None else []),
        *(extra[len(extra) - extra_take :] if extra_take else []),
        prefix_id,
        *(prefix[len(prefix) - prefix_take :] if prefix_take else []),
        suffix_id,
        *suffix[:suffix_take],
        middle_id,
        *middle,
    ]
    return tokens, truncated


class _EarlyStop(TextCut):
    """llama-server's two infill stops, applied to the text as it comes.

    ``n_indent``: once a line after the first starts with less indentation than asked (the
    completion left the block being written), cut the text there and stop.
    ``t_max_predict_ms``: once a newline was generated and the time since the first token
    passed the limit, stop (the lines so far are a usable completion)."""

    def __init__(self, n_indent: int, t_max_predict_ms: int) -> None:
        self.n_indent = n_indent
        self.deadline_ms = t_max_predict_ms
        self.text = ""
        self._line_start = -1  # where the latest line after a newline begins
        self.first_token_at: float | None = None
        self.stopped = False

    def feed(self, piece: str, now: float | None = None) -> str:
        """Take ``piece`` (at ``now``, monotonic seconds); return the text that may be sent
        now (a new line is held until its indentation is known)."""
        if self.stopped:  # nothing after the stop belongs to the completion
            return ""
        if now is None:
            now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
        sent = len(self._released())
        self.text += piece
        if self.n_indent > 0:
            self._check_indent()
        if (
            not self.stopped
            and self.deadline_ms > 0
            and "\n" in self.text
            and (now - self.first_token_at) * 1000 > self.deadline_ms
        ):
            self.stopped = True
        return self._released()[sent:]

    def rest(self) -> str:
        """The text held back, released at the end."""
        return self.text[len(self._released()) :]

    def _check_indent(self) -> None:
        while not self.stopped:
            if self._line_start < 0:  # the cursor's own line is never checked
                newline = self.text.find("\n")
                if newline < 0:
                    return
                self._line_start = newline + 1
            pos = self._line_start
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos >= len(self.text):
                return  # the indentation is not known yet
            if pos - self._line_start < self.n_indent:
                # as llama-server: an empty line ends it too; the cut keeps the indentation
                self.text = self.text[:pos]
                self.stopped = True
                return
            following = self.text.find("\n", pos)
            if following < 0:
                return
            self._line_start = following + 1

    def _released(self) -> str:
        if self.n_indent > 0 and not self.stopped and self._line_start >= 0:
            # the current line's indentation may still end the completion
            line = self.text[self._line_start :]
            if not line.strip(" \t"):
                return self.text[: self._line_start]
        return self.text


def _timings(done: Done) -> dict[str, Any]:
    """llama-server's ``timings``: the runner's when the generation ran to its end, the
    daemon's own measurement when it was stopped early."""
    t = done.timings
    prompt_n, prompt_ms = t.prompt_tokens - t.cached_tokens, t.prompt_ms
    predicted_n, predicted_ms = t.completion_tokens, t.decode_ms
    return {
        "cache_n": t.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(prompt_n / prompt_ms * 1000, 2) if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": (
            round(predicted_n / predicted_ms * 1000, 2) if predicted_ms else 0.0
        ),
        # localllm: where the time to the first token went, phase by phase (ms)
        **({"first_token_ms": _rounded(done.first_token)} if done.first_token else {}),
    }


def _rounded(phases: dict[str, float]) -> dict[str, float]:
    return {phase: round(ms, 3) for phase, ms in phases.items()}


def _select(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama-server's ``response_fields``: only the named fields, nested ones by a path
    (``timings/prompt_n``) and keyed by that path."""
    if fields is None:
        return body
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = body
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[path] = value
    return out


@router.post("/infill", summary="Fill in the middle (llama-server)")
async def infill(body: InfillRequest, request: Request, state: StateDep) -> Response:
    """llama-server's ``/infill``: the completion between ``input_prefix`` and
    ``input_suffix`` (see :class:`InfillRequest` for the fields), answered in the shape of
    its ``/completion`` (``content``, ``stop``, ``stop_type``, ``tokens_predicted``,
    ``tokens_evaluated``, ``truncated``, ``timings``), streamed as server-sent events."""
    model = _default_model(state, body.model)
    if "completion" not in model.capabilities():
        raise HTTPProblem(400, f"{model.name.short} cannot generate text", param="model")
    options, n_predict = _infill_sampling(model, body)
    config = runner_config(state.settings, model, options)
    # The context the runner has (or would plan): 0 in the config when the plan chooses.
    n_ctx = await context_length(state, request, model, config)
    tokens, truncated = await _infill_tokens(state, request, model, body, n_ctx, n_predict)
    early = body.n_indent > 0 or body.t_max_predict_ms > 0
    ask = Ask(
        model=model,
        api="llama",
        options=options,
        prompt_tokens=tokens,
        tune=lambda sampling: _apply_samplers(sampling, body.samplers),
        # an early stop leaves the runner's count behind: log probabilities count the tokens
        count_tokens=early,
    )
    cutter = (lambda: _EarlyStop(body.n_indent, body.t_max_predict_ms)) if early else None
    reply = await Reply.open(state, request, plan(state, ask), cutter)
    name = model.name.short

    def final(text: str, done: Done) -> dict[str, Any]:
        stop_type = {"stop": "eos", "stop_sequence": "word"}.get(done.reason, "limit")
        timings = _timings(done)
        completion = {
            "index": 0,
            "content": text,
            "id_slot": -1,
            "stop": True,
            "model": name,
            "tokens_predicted": timings["predicted_n"],
            "tokens_evaluated": len(tokens),
            "truncated": truncated,
            "stop_type": stop_type,
            "stopping_word": done.stop_sequence or "",
            "tokens_cached": done.cached_tokens,
            "timings": timings,
        }
        return _select(completion, body.response_fields)

    if not body.stream:
        (whole,) = await reply.whole(request)
        return JSONResponse(
            final(whole.content, whole.done), headers=reply.timing_headers(whole.done)
        )

    def partial(text: str) -> bytes:
        return sse_event(
            _select({"index": 0, "content": text, "stop": False}, body.response_fields)
        )

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for _, event in reply.events():
                if isinstance(event, Done):
                    yield sse_event(final("", event))
                    return
                if event.content:
                    yield partial(event.content)
        except Exception as exc:
            yield sse_event({"error": problem_from(exc, name).message})

    return ClosingStreamingResponse(
        stream(), media_type="text/event-stream", on_close=reply.close, timing=reply
    )
