"""The agent loop that ``localllm run`` and the TUI share: the model answers with the tools
on offer; each call it makes is shown, checked against the tool's schema, asked about
(yes / no / always for this tool in this chat; ``--yes`` approves all) and run with a
timeout; its result goes back to the model; the loop ends when the model answers without a
call, or at the step limit, which it says. A server's sampling request made meanwhile is
answered by the same local model, once the person allows it.

The chat surfaces only render: they give a :class:`LoopEvents` (streamed text, the calls,
the approval questions, notices) and read :attr:`AgentLoop.result`, which holds every
message the loop added so far, even when it was stopped half way (Esc, Ctrl-C): a stopped
call gets a result saying so, so the conversation stays one the model can read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._exceptions import ToolServerError
from .model import StepReply, StepRequest, model_step
from .results import ToolOutcome, outcome_from_result
from .timings import LoopTimings, Step
from .tools import ToolSpec, argument_problem

if TYPE_CHECKING:
    from ..client import AsyncClient, Think
    from .servers import ServerManager

__all__ = [
    "AgentLoop",
    "Approvals",
    "CallRecord",
    "Decision",
    "LoopEvents",
    "LoopRequest",
    "LoopResult",
]


class Decision:
    """What the person answers to "run this?" (plain strings)."""

    YES = "yes"
    NO = "no"
    ALWAYS = "always"
    """Yes, and do not ask again for this tool in this chat."""
    STOP = "stop"
    """No, and end the loop now."""


class Approvals:
    """Which calls run without asking: all of them with ``auto`` (``--yes``), else the tools
    the person answered "always" for, in this chat."""

    def __init__(self, auto: bool = False) -> None:
        self.auto = auto
        """Approve everything (``run --yes``)."""
        self.always: set[str] = set()
        """``server/tool`` keys (and ``server/sampling``) approved for the rest of the chat."""

    def granted(self, key: str) -> bool:
        """True when ``key`` runs without asking."""
        return self.auto or key in self.always


@dataclass
class CallRecord:
    """One call the model made, and what became of it."""

    id: str
    """The call's id (the tool message that answers it carries it)."""
    name: str
    """The function name the model used."""
    arguments: Any
    """The arguments it gave (an object, unless the model wrote something else)."""
    tool: ToolSpec | None
    """The tool it names (None: no such tool)."""
    status: str = "pending"
    """pending, asking, running, done, error, timeout, declined, stopped, skipped."""
    outcome: ToolOutcome | None = None
    """What goes back to the model."""
    seconds: float = 0.0
    """Time the call took (not counting the approval)."""
    waited: float = 0.0
    """Time spent waiting for the approval."""

    @property
    def title(self) -> str:
        """``server · tool``, or the name the model used for an unknown tool."""
        return f"{self.tool.server} · {self.tool.name}" if self.tool else self.name

    def message(self) -> dict[str, Any]:
        """The tool message that gives the result to the model."""
        outcome = self.outcome or ToolOutcome("no result", is_error=True)
        message: dict[str, Any] = {
            "role": "tool",
            "content": outcome.text,
            "tool_name": self.name,
            "tool_call_id": self.id,
        }
        if outcome.images:
            message["images"] = list(outcome.images)
        return message


class LoopEvents(Protocol):
    """What the chat surface does while the loop runs."""

    async def step_started(self, number: int) -> None:
        """Model step ``number`` (from 1) begins: its answer streams next."""

    async def write(self, thinking: str, content: str) -> None:
        """The next streamed piece of the step's reasoning and text (either may be empty)."""

    async def step_finished(self, number: int, reply: StepReply) -> None:
        """The step's answer is complete (its calls, if any, follow)."""

    async def call_shown(self, record: CallRecord) -> None:
        """A call is about to be asked about or run: show server, tool, arguments."""

    async def approve(self, record: CallRecord) -> str:
        """Ask whether to run the call: a :class:`Decision`."""

    async def call_finished(self, record: CallRecord) -> None:
        """The call ended (its status and outcome are set)."""

    async def approve_sampling(self, server: str, preview: str) -> str:
        """Ask whether ``server`` may have the model answer ``preview``: a :class:`Decision`."""

    async def notice(self, text: str) -> None:
        """Something the person should know (a step limit, a server that failed)."""


@dataclass
class LoopRequest:
    """One message's loop."""

    model: str
    messages: Sequence[Mapping[str, Any]]
    """The conversation, ending with the new question (``/api/chat``'s shape)."""
    tools: Sequence[ToolSpec]
    """The tools on offer (with their call names)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: str | float | None = None
    think: Think | None = None
    format: str | dict[str, Any] | None = None
    required: bool = False
    """The first step must call a tool (``--tools required``)."""
    max_steps: int = 10
    """Most model steps."""
    max_result: int = 32_000
    """Most characters of one tool result given to the model."""
    vision: bool = False
    """The model sees images (tool images go to it as images)."""


@dataclass
class LoopResult:
    """What the loop did so far."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    """The messages it added to the conversation, in order (assistant, tool, ..., the last
    assistant answer)."""
    calls: list[CallRecord] = field(default_factory=list)
    """Every call, in order."""
    timings: LoopTimings = field(default_factory=LoopTimings)
    """Every step, timed."""
    final: dict[str, Any] = field(default_factory=dict)
    """The last model step's final chunk (timings, ``done_reason``)."""
    content: str = ""
    """The last answer's text."""
    thinking: str = ""
    """The last answer's reasoning."""
    limit_reached: bool = False
    """The loop stopped at the step limit."""
    stopped: bool = False
    """The person stopped it (a "stop" answer)."""


class AgentLoop:
    """One message's loop; :meth:`run` it, read :attr:`result` (also after a cancel)."""

    def __init__(
        self,
        client: AsyncClient,
        servers: ServerManager,
        request: LoopRequest,
        events: LoopEvents,
        approvals: Approvals,
    ) -> None:
        self.client = client
        self.servers = servers
        self.request = request
        self.events = events
        self.approvals = approvals
        self.result = LoopResult()
        """What the loop did so far."""
        self._tools = {tool.call_name or tool.name: tool for tool in request.tools}

    async def run(self) -> LoopResult:
        """Run the loop to its end; returns :attr:`result`."""
        request, result = self.request, self.result
        functions = [tool.as_function() for tool in request.tools]
        previous = self.servers.sampler
        self.servers.sampler = self._sample
        try:
            for number in range(1, request.max_steps + 1):
                await self.events.step_started(number)
                reply = await model_step(
                    self.client,
                    StepRequest(
                        model=request.model,
                        messages=[*request.messages, *result.messages],
                        tools=functions,
                        options=request.options,
                        keep_alive=request.keep_alive,
                        think=request.think,
                        format=request.format,
                        force=request.required and number == 1 and bool(functions),
                    ),
                    self.events.write,
                )
                result.timings.add(Step("model", f"step {number}", reply.seconds, reply.final))
                result.final, result.content, result.thinking = (
                    reply.final,
                    reply.content,
                    reply.thinking,
                )
                await self.events.step_finished(number, reply)
                if reply.final.get("done_reason") == "length":
                    await self.events.notice(
                        "the model's answer was cut at its token limit (num_predict)"
                        + (": a call it was writing was lost" if not reply.calls else "")
                    )
                answer: dict[str, Any] = {"role": "assistant", "content": reply.content}
                if reply.thinking:
                    answer["thinking"] = reply.thinking
                if not reply.calls:
                    result.messages.append(answer)
                    return result
                answer["tool_calls"] = reply.calls
                result.messages.append(answer)
                await self._run_calls(
                    [self._record(call) for call in reply.calls], number == request.max_steps
                )
                if result.stopped:
                    await self.events.notice("stopped: the calls' results were not given back")
                    return result
            result.limit_reached = True
            await self.events.notice(
                f"stopped after {request.max_steps} model steps (the step limit, "
                "LOCALLLM_MCP_MAX_STEPS): the model's last calls were not run; send a message "
                "to go on"
            )
            return result
        finally:
            self.servers.sampler = previous

    async def _run_calls(self, records: list[CallRecord], last: bool) -> None:
        """Run one step's calls in order; each gets its tool message, also when the loop is
        stopped (Esc, Ctrl-C) in the middle: the running call and the ones after it are
        answered "stopped" / "not run", so the conversation stays whole."""
        result = self.result
        for index, record in enumerate(records):
            result.calls.append(record)
            try:
                if last or result.stopped:
                    why = "the step limit was reached" if last else "the person stopped the loop"
                    self._finish(record, "skipped", f"not run: {why}", error=True)
                    await self.events.call_finished(record)
                else:
                    await self._run_call(record)
            except asyncio.CancelledError:
                if record.outcome is None:
                    self._finish(record, "stopped", "stopped by the person", error=True)
                result.messages.append(record.message())
                for rest in records[index + 1 :]:
                    self._finish(
                        rest, "skipped", "not run: the person stopped the loop", error=True
                    )
                    result.calls.append(rest)
                    result.messages.append(rest.message())
                raise
            result.messages.append(record.message())

    def _record(self, call: Mapping[str, Any]) -> CallRecord:
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        return CallRecord(
            id=str(call.get("id") or ""),
            name=name,
            arguments=function.get("arguments"),
            tool=self._tools.get(name),
        )

    def _finish(self, record: CallRecord, status: str, text: str, *, error: bool) -> None:
        record.status = status
        record.outcome = ToolOutcome(text, is_error=error, total=len(text))

    async def _run_call(self, record: CallRecord) -> None:
        tool = record.tool
        if tool is None:
            names = ", ".join(self._tools) or "none"
            self._finish(
                record, "error", f"no tool is called {record.name!r} (tools: {names})", error=True
            )
            await self.events.call_finished(record)
            return
        problem = argument_problem(tool.input_schema, record.arguments)
        if problem is not None:
            self._finish(record, "error", f"invalid arguments, not run: {problem}", error=True)
            await self.events.call_finished(record)
            return
        await self.events.call_shown(record)
        if not self.approvals.granted(tool.key):
            record.status = "asking"
            began = time.monotonic()
            decision = await self.events.approve(record)
            record.waited = time.monotonic() - began
            if decision == Decision.ALWAYS:
                self.approvals.always.add(tool.key)
            elif decision in (Decision.NO, Decision.STOP):
                self.result.stopped = decision == Decision.STOP
                self._finish(record, "declined", "the person declined this call", error=True)
                self.result.timings.add(
                    Step("tool", tool.key, 0.0, waited=record.waited, status="declined")
                )
                await self.events.call_finished(record)
                return
        await self._call(record, tool)

    async def _call(self, record: CallRecord, tool: ToolSpec) -> None:
        record.status = "running"
        began = time.monotonic()
        step = self.result.timings.add(Step("tool", tool.key, 0.0, waited=record.waited))
        try:
            handle = self.servers.handle(tool.server)
            if handle.state != "running":
                await handle.start()  # it exited since: once more, as on first need
            result = await handle.call(tool.name, dict(record.arguments))
        except ToolServerError as exc:
            status = "timeout" if "did not answer" in str(exc) else "error"
            self._finish(record, status, str(exc), error=True)
        except asyncio.CancelledError:
            self._finish(record, "stopped", "stopped by the person before it ended", error=True)
            raise
        else:
            record.outcome = outcome_from_result(
                result, limit=self.request.max_result, vision=self.request.vision
            )
            record.status = "error" if record.outcome.is_error else "done"
        finally:
            record.seconds = step.seconds = time.monotonic() - began
            step.status = record.status
        await self.events.call_finished(record)

    # -- sampling -------------------------------------------------------------------------

    async def _sample(self, server: str, params: Any) -> Any:
        """A server's ``sampling/createMessage``, answered by the chat's model."""
        from mcp.types import CreateMessageResult, ErrorData, TextContent

        messages = _sampling_messages(params)
        preview = "\n".join(m["content"] for m in messages if m["role"] != "system")[-2000:]
        key = f"{server}/sampling"
        began = time.monotonic()
        if not self.approvals.granted(key):
            decision = await self.events.approve_sampling(server, preview)
            if decision == Decision.ALWAYS:
                self.approvals.always.add(key)
            elif decision != Decision.YES:
                return ErrorData(code=-1, message="the person declined the sampling request")
        waited = time.monotonic() - began
        options: dict[str, Any] = {**self.request.options, "num_predict": params.max_tokens}
        if params.temperature is not None:
            options["temperature"] = params.temperature
        if params.stop_sequences:
            options["stop"] = list(params.stop_sequences)
        began = time.monotonic()
        try:
            answer = await self.client.chat(
                self.request.model,
                messages,  # type: ignore[arg-type]
                options=options,
                keep_alive=self.request.keep_alive,
            )
        except Exception as exc:  # the server gets the reason; the chat goes on
            return ErrorData(code=-1, message=f"the local model could not answer: {exc}")
        final = {k: v for k, v in answer.items() if k not in ("message", "model")}
        self.result.timings.add(
            Step("sampling", server, time.monotonic() - began, final, waited=waited)
        )
        text = (answer.get("message") or {}).get("content") or ""
        with contextlib.suppress(Exception):
            await self.events.notice(
                f"{server} asked the model ({final.get('eval_count', 0)} tokens answered)"
            )
        return CreateMessageResult(
            role="assistant",
            content=TextContent(type="text", text=text),
            model=self.request.model,
            stop_reason="maxTokens" if final.get("done_reason") == "length" else "endTurn",
        )


def _sampling_messages(params: Any) -> list[dict[str, Any]]:
    """A sampling request's messages in ``/api/chat``'s shape (text and images)."""
    messages: list[dict[str, Any]] = []
    if params.system_prompt:
        messages.append({"role": "system", "content": params.system_prompt})
    for message in params.messages:
        blocks = message.content if isinstance(message.content, list) else [message.content]
        texts = [b.text for b in blocks if getattr(b, "type", None) == "text"]
        images = [b.data for b in blocks if getattr(b, "type", None) == "image"]
        item: dict[str, Any] = {"role": message.role, "content": "\n".join(texts)}
        if images:
            item["images"] = images
        messages.append(item)
    return messages
