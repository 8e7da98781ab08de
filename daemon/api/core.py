"""One request core for every API family: a neutral request, one planning pipeline, one reply
stream read in one place.

Each family module (:mod:`.ollama`, :mod:`.openai`, :mod:`.anthropic`, :mod:`.responses`,
:mod:`.llamaserver`) only decodes its wire format into an :class:`Ask` (messages as
:class:`Turn` items, tools, tool choice, reasoning, format, sampling, images, stream, ``n``),
calls :func:`plan` (template, tools, reasoning, grammar, images, options → runner jobs) and
:meth:`Reply.open`, and encodes the :class:`Delta` and :class:`Done` events it reads (text,
reasoning and call deltas; the end with its reason, usage and timings) into its framing, field
names and errors, as llama-server turns every family into one chat request and renders one
result per family. Stop strings are matched once, in the runner (which names the one that
matched); what a parser holds back and the log probabilities that travel with it are kept
here, once. No family module imports another.

What differs between the families on purpose, decided by each adapter through the
:class:`Ask` it builds and the events it encodes:

* **Thinking default**: Ollama, OpenAI chat and Responses leave reasoning to the template's
  default (on) unless the request switches it; Anthropic switches it off unless ``thinking``
  is ``enabled`` or ``adaptive``. Levels: Ollama ``think``, OpenAI ``reasoning_effort``,
  Responses ``reasoning.effort``, Anthropic ``output_config.effort``. One reasoning budget
  for all (:attr:`Ask.thinking_budget`, ended as llama-server ends it: the close tag is
  inserted, then the answer follows): Anthropic's ``budget_tokens``, the ``thinking_budget``
  option, and a level on a template without levels
  (:data:`~localllm.daemon.prompt.thinking.LEVEL_BUDGETS`).
* **Stop handling and stop reasons**: all stop strings are the runner's. Ollama reports
  ``stop``/``length``; OpenAI ``stop``, ``length``, ``tool_calls``; Anthropic ``end_turn``,
  ``max_tokens``, ``stop_sequence`` (with the string) and ``tool_use``; Responses
  ``completed`` or ``incomplete``. A call cut by the token limit is dropped and reported as
  the limit (``length``, ``max_tokens``, ``incomplete``), never as a call.
* **Usage counting**: OpenAI counts the prompt once for its ``n`` choices and cached tokens
  inside ``prompt_tokens``; Anthropic's ``input_tokens`` leaves the cached ones out
  (``cache_read_input_tokens``); Responses counts reasoning tokens apart; Ollama reports
  nanosecond durations and counts.
* **Call-argument shape**: Ollama an object, OpenAI chat and Responses a JSON string,
  Anthropic ``input`` (an object, streamed as one ``input_json_delta``). Ollama, Anthropic
  and Responses send each call whole; OpenAI streams it with an ``index``.
* **Unknown-field policy**: Ollama, OpenAI chat/completions and llama-server ignore unknown
  fields (their servers do, and newer clients send more); Anthropic and Responses refuse them
  with a 400 naming them.
* **Error codes and wording**: Ollama ``{"error": "..."}``; OpenAI and Responses
  ``{"error": {"message", "type", "param", "code"}}``; Anthropic ``{"type": "error", ...}``
  with 529 for a full queue and its "prompt is too long" wording (see :mod:`.errorshapes`).
  A model that cannot generate is "does not support generate" on Ollama's routes, "cannot
  generate text" elsewhere.
* **Where images may appear**: Ollama on any message (``images``), OpenAI chat in user
  messages only (``image_url`` parts), Anthropic in user turns and tool results, Responses
  in user, system and tool-output content, llama-server nowhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from fastapi import Request

from localllm.store.models import LocalModel

from ..errors import ClientGone, HTTPProblem, problem_from
from ..firsttoken import ARRIVAL, FirstToken, server_timing
from ..generation import Generation, Job, Outcome, start, until_disconnect
from ..loadconfig import runner_config
from ..options import sampling_options
from ..prompt.plan import PromptPlan, plan_prompt
from ..prompt.thinking import ThinkPlan
from ..prompt.tools import ToolPlan
from ..runner.client import TokenChunk
from ..runner.protocol import GenerationRequest, SamplingOptions, Timings, TokenLogprob
from ..state import DaemonState
from ..toolcalls import Parsed, ToolCall
from .logprobs import apply_logprobs
from .tooling import AnswerStream
from .vision import Images

__all__ = [
    "Ask",
    "Delta",
    "Done",
    "Plan",
    "Reply",
    "TextCut",
    "Turn",
    "Whole",
    "plan",
    "plan_batch",
]

T = TypeVar("T")

EndReason = Literal["stop", "length", "stop_sequence"]


@dataclass
class Turn:
    """One message of a conversation, in no family's shape."""

    role: str
    """``system``, ``user``, ``assistant``, ``tool`` (or a template's own role)."""
    content: str = ""
    """Its text, with an image marker where each of its images goes."""
    thinking: str | None = None
    """An assistant's earlier reasoning."""
    tool_calls: list[dict[str, Any]] | None = None
    """An assistant's calls: ``{"id"?, "function": {"name", "arguments"}}`` (arguments an
    object or a JSON string)."""
    tool_name: str | None = None
    """The tool a ``tool`` message answers for."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers."""


@dataclass
class Ask:
    """One generation request, decoded from any family's wire format."""

    model: LocalModel
    """The model (resolved, so an unknown one was a 404 already)."""
    api: str
    """The family (``ollama``, ``openai``, ``anthropic``, ``llama``): the metrics label."""
    turns: list[Turn] | None = None
    """A conversation for the chat template; None for a prompt."""
    prompt: str | None = None
    """A prompt: one user turn for the template, or the whole input when ``raw``."""
    prompt_tokens: list[int] | None = None
    """A prompt given as the model's token ids (used exactly, no template, no BOS added)."""
    raw: bool = False
    """The prompt is the whole input (no template)."""
    system: str | None = None
    """A system prompt given apart from the turns (Ollama's ``system``)."""
    suffix: str | None = None
    """Fill in the middle: the text after the cursor (the prompt is the text before)."""
    context: list[int] | None = None
    """Tokens of an earlier exchange the prompt continues (Ollama's ``context``)."""
    template: str | None = None
    """A Jinja chat template from the request, instead of the model's."""
    tools: list[Any] | None = None
    """Tool definitions in OpenAI's nested function shape (checked by the planner)."""
    tool_choice: str | dict[str, Any] | None = None
    """OpenAI's ``tool_choice`` vocabulary."""
    parallel: bool | None = None
    """False: at most one call per answer."""
    strict: bool = False
    """Some tool is strict: every call must be checked against its schema by a grammar."""
    tool_renames: Sequence[tuple[str, str]] = ()
    """How the planner's field names are spelt in this family (``tools[0].function.x`` →
    ``tools[0].x``), for its 400s."""
    think: bool | str | None = None
    """Reasoning: on, off, a level; None leaves the template's default."""
    think_field: str = "think"
    """The request field that set ``think`` (for 400s)."""
    thinking_budget: int | None = None
    """Most tokens of reasoning (None: the ``thinking_budget`` option, or the level's
    budget, or none): the runner then inserts the close tag and the answer follows."""
    format: str | dict[str, Any] | None = None
    """``"json"`` for any JSON, or a JSON schema the answer must follow."""
    options: dict[str, Any] = field(default_factory=dict)
    """Merged, validated options (:func:`~localllm.daemon.options.merge_options`)."""
    logit_bias: dict[str, float] = field(default_factory=dict)
    """Token id (a string) → bias."""
    logprobs: bool = False
    """Report each generated token's log probability."""
    top_logprobs: int = 0
    """With ``logprobs``: this many alternatives per position."""
    images: Images | None = None
    """The request's images, in the order of their markers."""
    n: int = 1
    """Choices to generate from the one prompt."""
    truncate: bool = False
    """Cut a prompt over the context instead of a 400."""
    shift: bool | None = None
    """False: end with ``length`` at the end of the context instead of shifting it."""
    keep_alive: float | None = None
    """How long the model stays loaded after this request (None: the setting)."""
    return_context: bool = False
    """Return the prompt and answer tokens (Ollama's ``context``)."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Template variables the request sets itself (they win over the reasoning switches)."""
    tune: Callable[[SamplingOptions], None] | None = None
    """A last adjustment of the sampling options (llama-server's ``samplers``)."""
    count_tokens: bool = False
    """The reply may be cut short here (a :class:`TextCut`): count its tokens exactly."""
    prompt_logprobs: bool = False
    """Report the prompt tokens' log probabilities (from the prefill; the first choice's)."""
    prefill_only: bool = False
    """Evaluate the prompt, generate nothing (a scoring request's ``max_tokens: 0``)."""


@dataclass
class Plan:
    """A planned request: the runner jobs and what reading their output needs."""

    ask: Ask
    """The request."""
    jobs: list[Job]
    """One job per choice."""
    prompt: PromptPlan
    """The prompt planned (its tools and reasoning say how to read the answer; a batch's
    are the first prompt's, as its prompts have neither)."""
    counted: bool = False
    """The runner reports log probabilities only to count tokens (a reply may be cut short
    here); they are not the client's."""

    @property
    def tools(self) -> ToolPlan | None:
        """The tools offered, their grammar and parser."""
        return self.prompt.tools

    @property
    def think(self) -> ThinkPlan | None:
        """The reasoning switch and splitter."""
        return self.prompt.think


def _sampling(ask: Ask) -> SamplingOptions:
    sampling = sampling_options(ask.options)
    sampling.logit_bias = dict(ask.logit_bias)
    if ask.format == "json":
        sampling.json_mode = True
    elif isinstance(ask.format, dict):
        sampling.json_schema = ask.format
    apply_logprobs(sampling, ask.logprobs, ask.top_logprobs)
    sampling.prompt_logprobs = ask.prompt_logprobs
    sampling.prefill_only = ask.prefill_only
    if ask.shift is False:
        sampling.shift = False
    if ask.tune is not None:
        ask.tune(sampling)
    return sampling


def plan(state: DaemonState, ask: Ask) -> Plan:
    """Plan ``ask``: the sampling, the prompt (:func:`~localllm.daemon.prompt.plan.plan_prompt`:
    template, tools, reasoning, grammar), one job per choice. Every problem with the request
    is a 400 here, before anything runs."""
    # FirstToken.now()'s clock, read here: planning stays one call into the prompt room
    began = time.perf_counter_ns()
    model = ask.model
    if "completion" not in model.capabilities():
        wording = "does not support generate" if ask.api == "ollama" else "cannot generate text"
        raise HTTPProblem(400, f"{model.name.short} {wording}", param="model")
    prompt = plan_prompt(ask, _sampling(ask))
    sampling = prompt.options
    request = GenerationRequest(
        id="",
        prompt=prompt.text,
        messages=prompt.messages,
        suffix=prompt.suffix,
        template=prompt.template,
        raw=prompt.raw,
        truncate=ask.truncate,
        options=sampling,
        context=prompt.context,
        return_context=ask.return_context,
        tools=prompt.tool_definitions,
        template_kwargs=prompt.template_kwargs,
        render_special=prompt.render_special,
        images=ask.images.encoded if ask.images is not None else [],
    )
    # A reply cut short here (a text filter) ends before the runner's count: one log
    # probability per token counts them exactly.
    counted = ask.count_tokens and not sampling.logprobs
    if counted:
        sampling.logprobs = True
    # the runner's load config, decided once for every choice (draft, adapters, memory plan)
    config = runner_config(state.settings, model, ask.options)
    jobs = []
    for index in range(max(ask.n, 1)):
        # With a seed, choice i samples with seed + i: the choices differ, and each is
        # reproducible on its own. Sent together, the engine prefills the prompt once.
        copy = dataclasses.replace(request, options=dataclasses.replace(request.options))
        if index and copy.options.seed >= 0:
            copy.options.seed = (copy.options.seed + index) & 0xFFFFFFFF
        if index:
            # The choices share the prompt: its log probabilities are the first choice's, and
            # the others may reuse its cells instead of evaluating it again.
            copy.options.prompt_logprobs = False
        jobs.append(Job(model, config, copy, ask.keep_alive, ask.api))
    planned = time.perf_counter_ns()
    for job in jobs:
        job.planning, job.planned = began, planned
    return Plan(ask=ask, jobs=jobs, prompt=prompt, counted=counted)


def plan_batch(state: DaemonState, asks: Sequence[Ask]) -> Plan:
    """One plan for several prompts answered together (OpenAI completions' list of
    prompts): each planned as :func:`plan` does, their jobs in order (prompt after prompt,
    ``n`` choices each). The prompts must not differ in tools or reasoning."""
    plans = [plan(state, ask) for ask in asks]
    first = plans[0]
    assert all(p.tools is None and p.think is None for p in plans[1:]), "a batch of prompts"
    jobs = [job for planned in plans for job in planned.jobs]
    return Plan(first.ask, jobs, first.prompt, first.counted)


# --- the reply stream -------------------------------------------------------------------------


@dataclass(slots=True)
class Delta:
    """The next piece of one choice's answer, as far as it is certain."""

    content: str = ""
    """Answer text."""
    thinking: str = ""
    """Reasoning text."""
    calls: list[ToolCall] = field(default_factory=list)
    """Calls complete and parsed (each reported once)."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """Log probabilities of the tokens this piece's text came from (when asked for)."""


@dataclass
class Done:
    """How one choice's answer ended."""

    reason: EndReason
    """``stop`` (the model ended), ``length`` (the token limit, or an early stop),
    ``stop_sequence`` (one of the request's stop strings)."""
    stop_sequence: str | None
    """The stop string that matched."""
    calls: int
    """Calls the answer reported."""
    cut: bool
    """A call was cut by the token limit (and dropped): the answer ran out, it made no call."""
    prompt_tokens: int
    """Tokens in the prompt."""
    cached_tokens: int
    """Of those, tokens reused from the cache."""
    output_tokens: int
    """Tokens generated."""
    reasoning_tokens: int
    """Of those, tokens generated while the model was reasoning (as the output shows)."""
    timings: Timings
    """The runner's timings, or the daemon's measurement when the answer was cut short."""
    outcome: Outcome | None
    """The runner's outcome (load time, context...); None when cut short here."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """Log probabilities of tokens whose text was never shown (dropped call markup)."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """The prompt tokens' log probabilities, when asked for (the first token's is
    meaningless: nothing comes before it)."""
    budget_exhausted: bool = False
    """The reasoning budget ran out: the close tag was inserted and the answer followed."""
    truncation: dict[str, int] = field(default_factory=dict)
    """What truncation left out of the prompt (``truncated_messages``: older chat messages,
    ``truncated_tokens``); empty when nothing was."""
    first_token: dict[str, float] = field(default_factory=dict)
    """Where the time to the first token went, phase by phase in ms, ending with ``ttft``
    (see :mod:`localllm.daemon.firsttoken`); empty when no token came."""

    @property
    def limited(self) -> bool:
        """Whether the answer ran into the token limit or had a call cut off."""
        return self.reason == "length" or self.cut


@dataclass
class Whole:
    """One choice's whole answer (non-streamed replies)."""

    content: str
    """Answer text."""
    thinking: str
    """Reasoning text."""
    calls: list[ToolCall]
    """Its calls."""
    logprobs: list[TokenLogprob]
    """Every token's log probability (when asked for)."""
    done: Done
    """How it ended."""


class TextCut:
    """A filter that may end an answer early on its text (llama-server's ``n_indent``...):
    :meth:`feed` returns the text that may be shown now, :meth:`rest` what it held back,
    ``stopped`` says the answer is over."""

    stopped: bool = False

    def feed(self, text: str) -> str:
        """Take the next text; return what may be shown now."""
        return text

    def rest(self) -> str:
        """The text held back, released at the end."""
        return ""


class _Choice:
    """One choice while it is read."""

    __slots__ = (
        "answer",
        "begun",
        "cutter",
        "first_at",
        "generation",
        "in_thinking",
        "index",
        "pending",
        "reasoning",
        "tokens",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.generation: Generation | None = None
        self.answer = AnswerStream()
        self.pending: list[TokenLogprob] = []
        self.tokens = 0
        self.reasoning = 0
        self.in_thinking = False
        self.cutter: TextCut | None = None
        self.begun = time.monotonic()
        self.first_at = 0.0


_EMPTY = Parsed()


class Reply:
    """The answer to a :class:`Plan`: its choices' generations, read as :class:`Delta` and
    :class:`Done` events. Open it with :meth:`open` (which starts every choice and waits for
    the first to be accepted, so a bad request or a full queue still gets its status code),
    then read :meth:`events` or :meth:`whole` once, and :meth:`close` it however the answer
    ended (idempotent)."""

    def __init__(
        self,
        plan: Plan,
        starts: list[asyncio.Future[Generation]],
        cutter: Callable[[], TextCut] | None = None,
    ) -> None:
        self.plan = plan
        self.starts = starts
        self.choices = [_Choice(i) for i in range(len(starts))]
        self.model_name = plan.ask.model.name.short
        self._cutter = cutter
        self._readers: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[tuple[int, Delta | Done | BaseException]] = asyncio.Queue()
        self._closed = False
        self._whole = False
        self._state: DaemonState | None = None

    @classmethod
    async def open(
        cls,
        state: DaemonState,
        request: Request,
        plan: Plan,
        cutter: Callable[[], TextCut] | None = None,
    ) -> Reply:
        """Start every choice (together, so the engine shares the prompt); return once the
        first is accepted. ``cutter`` makes the filter that may end each choice early."""
        received = request.scope.get(ARRIVAL)
        if received is not None:
            for job in plan.jobs:
                job.clock.received = received
        starts = [asyncio.ensure_future(start(state, request, job)) for job in plan.jobs]
        reply = cls(plan, starts, cutter)
        reply._state = state
        try:
            await asyncio.shield(starts[0])
        except BaseException:
            reply.close()
            raise
        return reply

    @property
    def clock(self) -> FirstToken:
        """The first choice's first-token clock (the reply's first token is its)."""
        return self.plan.jobs[0].clock

    def first_known(self) -> bool:
        """Whether the first token has arrived from the runner."""
        return bool(self.clock.first_chunk)

    def server_timing(self) -> str:
        """The ``Server-Timing`` value as the first byte goes out (a streamed reply)."""
        return self.clock.header()

    def timing_headers(self, done: Done) -> dict[str, str]:
        """The headers of a whole reply whose first choice ended with ``done``: its
        ``Server-Timing``, every phase known."""
        phases = done.first_token or self.clock.durations()
        return {"Server-Timing": server_timing(phases)}

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens (the first choice's, as the runner counted it)."""
        return self.starts[0].result().prompt_tokens

    def _begin(self, c: _Choice, generation: Generation) -> None:
        c.generation = generation
        # Only now is the rendered prompt known: did the template open the reasoning block?
        c.answer = AnswerStream(self.plan.tools, self.plan.think, generation.stream.prompt_tail)
        c.cutter = self._cutter() if self._cutter is not None else None
        c.begun = time.monotonic()

    async def _choice_events(self, c: _Choice) -> AsyncIterator[Delta | Done]:
        """One choice's events; failures raise :class:`HTTPProblem`."""
        try:
            generation = await self.starts[c.index]
        except (HTTPProblem, ClientGone):
            raise
        except Exception as exc:
            raise problem_from(exc, self.model_name) from exc
        self._begin(c, generation)
        think = self.plan.think
        shown = self.plan.ask.logprobs
        chunks = generation.chunks()
        try:
            async for item in chunks:
                if isinstance(item, Outcome):
                    for event in self._ended(c, item):
                        yield event
                    return
                delta = self._feed(c, item, think is not None, shown)
                if delta is not None:
                    yield delta
                cutter = c.cutter
                if cutter is not None and cutter.stopped:
                    for event in self._cut_short(c):
                        yield event
                    return
        except (HTTPProblem, ClientGone):
            raise
        except Exception as exc:
            raise problem_from(exc, self.model_name) from exc
        finally:
            await chunks.aclose()
            generation.close()

    def _feed(self, c: _Choice, item: TokenChunk, think: bool, shown: bool) -> Delta | None:
        """The delta of one runner chunk (None while everything is held back)."""
        logprobs = item.logprobs
        count = len(logprobs) if logprobs else 1
        c.tokens += count
        if not c.first_at:
            c.first_at = time.monotonic()
        if logprobs and shown:
            c.pending += logprobs
        text = item.text
        if c.cutter is not None:
            text = c.cutter.feed(text)
        parsed = c.answer.feed(text) if text else _EMPTY
        if think:
            was = c.in_thinking
            if parsed.thinking:
                c.in_thinking = True
            if parsed.content.strip() or parsed.calls:
                c.in_thinking = False
            if was or c.in_thinking:
                c.reasoning += count
        if not (parsed.content or parsed.thinking or parsed.calls):
            return None
        taken, c.pending = c.pending, []
        return Delta(parsed.content, parsed.thinking, parsed.calls, taken)

    def _cut_short(self, c: _Choice) -> list[Delta | Done]:
        """The events ending a choice its filter stopped here."""
        events: list[Delta | Done] = []
        rest = c.answer.feed(c.cutter.rest()) if c.cutter is not None else Parsed()
        rest.add(c.answer.finish(cut=True))
        if rest:
            taken, c.pending = c.pending, []
            events.append(Delta(rest.content, rest.thinking, rest.calls, taken))
        now = time.monotonic()
        first = c.first_at or now
        generation = c.generation
        assert generation is not None
        measured = Timings(
            prompt_tokens=generation.prompt_tokens,
            prompt_ms=(first - c.begun) * 1000,
            completion_tokens=c.tokens,
            decode_ms=(now - first) * 1000,
        )
        # the runner reports cache use at the end, which is not awaited here
        events.append(self._done(c, "length", None, rest, measured, None))
        return events

    def _ended(self, c: _Choice, outcome: Outcome) -> list[Delta | Done]:
        """The events ending a choice the runner ended (a failed generation raises): what
        was held back, then its :class:`Done`."""
        result = outcome.result
        if result.done_reason == "error":
            raise HTTPProblem(500, result.error or "generation failed")
        reason: EndReason = "length" if result.done_reason == "length" else "stop"
        if result.stop_sequence is not None:
            reason = "stop_sequence"
        rest = Parsed()
        if c.cutter is not None and (held := c.cutter.rest()):
            rest = c.answer.feed(held)
        rest.add(c.answer.finish(cut=reason == "length"))
        events: list[Delta | Done] = []
        if rest:
            events.append(Delta(rest.content, rest.thinking, rest.calls, self._leftover(c)))
        done = self._done(c, reason, result.stop_sequence, rest, result.timings, outcome)
        done.prompt_logprobs = result.prompt_logprobs
        done.budget_exhausted = result.budget_exhausted
        events.append(done)
        return events

    def _done(
        self,
        c: _Choice,
        reason: EndReason,
        stop_sequence: str | None,
        rest: Parsed,
        timings: Timings,
        outcome: Outcome | None,
    ) -> Done:
        done = Done(
            reason=reason,
            stop_sequence=stop_sequence,
            calls=c.answer.calls_made,
            cut=rest.cut,
            prompt_tokens=timings.prompt_tokens,
            cached_tokens=timings.cached_tokens,
            output_tokens=timings.completion_tokens,
            reasoning_tokens=min(c.reasoning, timings.completion_tokens),
            timings=timings,
            outcome=outcome,
            logprobs=self._leftover(c),
            truncation=c.generation.truncation() if c.generation is not None else {},
        )
        if c.generation is not None and (clock := c.generation.job.clock).first_chunk:
            if self._whole and not clock.out_at:
                clock.out_at = clock.first_chunk  # no first byte before the whole answer
            done.first_token = clock.durations(timings)
            if self._state is not None:
                self._state.metrics.observe_first_token(self.model_name, done.first_token)
        return done

    def _leftover(self, c: _Choice) -> list[TokenLogprob]:
        taken, c.pending = c.pending, []
        return taken

    async def events(self) -> AsyncIterator[tuple[int, Delta | Done]]:
        """Every choice's events as they come, ``(choice index, event)``, until each choice
        is done; a failure raises :class:`HTTPProblem` (the rest are stopped).

        With several choices each is read by a task of its own, so choices that wait for a
        slot get one as soon as earlier ones finish, whatever the client reads; a single
        choice (nearly every request) is read in place: a task would only add a queue and a
        wake-up per token."""
        if len(self.choices) == 1:
            async for event in self._choice_events(self.choices[0]):
                yield 0, event
            return
        self._readers = [asyncio.create_task(self._read(c)) for c in self.choices]
        open_choices = len(self.choices)
        while open_choices:
            index, item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Done):
                open_choices -= 1
            yield index, item

    async def _read(self, c: _Choice) -> None:
        try:
            async for event in self._choice_events(c):
                self._queue.put_nowait((c.index, event))
        except Exception as exc:
            self._queue.put_nowait((c.index, exc))

    async def whole(self, request: Request) -> list[Whole]:
        """Every choice run to its end (non-streamed replies); gives up when the client
        leaves. Failures raise :class:`HTTPProblem`."""

        async def collect(c: _Choice) -> Whole:
            content, thinking, calls, logprobs = [], [], [], []
            async for event in self._choice_events(c):
                if isinstance(event, Done):
                    logprobs += event.logprobs
                    return Whole("".join(content), "".join(thinking), calls, logprobs, event)
                content.append(event.content)
                thinking.append(event.thinking)
                calls += event.calls
                logprobs += event.logprobs
            raise HTTPProblem(500, "the generation ended without a result")

        self._whole = True
        try:
            return await until_disconnect(request, _all([collect(c) for c in self.choices]))
        finally:
            self.close()

    def close(self) -> None:
        """Stop every reader and every generation that started (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for reader in self._readers:
            reader.cancel()
        for future in self.starts:
            if not future.done():
                future.cancel()
            elif not future.cancelled() and future.exception() is None:
                future.result().close()


async def _all(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Await all together; the first failure cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
