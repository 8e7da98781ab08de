"""Where one request's time to first token went, phase by phase.

Every generation request carries a :class:`FirstToken`: the daemon stamps its own phases with
``time.perf_counter_ns`` as the request passes (HTTP and parsing, planning, queueing for a
slot, loading), the runner reports what it did with the prompt (template render, tokenizing)
when it accepts it and what the engine did (waiting for a slot, prefill steps, the first
sample, detokenizing) in its final timings. The hand-over to the runner is the rest of the
way the prompt took to the engine: from the slot held in the daemon to the runner's
acceptance, less the template and tokenizing (the runner stamps when it read the request and
when it accepted it on the same clock: ``perf_counter_ns`` is the machine's monotonic clock,
one for all its processes); the engine's share runs from that acceptance to the first text's
arrival in the daemon, and the relay is what of it the engine did not spend (the wire back,
the event loops).

The phases, in order (:data:`PHASES`), and how they are exposed:

* a ``Server-Timing`` header (the web's convention, ``name;dur=ms``) on every generation
  reply: a streamed reply's goes out with its first byte, so it has the phases known then
  (the engine's split is not: ``engine`` stands for it); a whole reply's has them all;
* the final chunk's timings (:meth:`FirstToken.durations`), and ``/metrics``
  (``localllm_first_token_phase_seconds``, a histogram per phase).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from .runner.protocol import Timings

__all__ = ["ARRIVAL", "ENGINE_PHASES", "PHASES", "FirstToken", "server_timing"]

ARRIVAL = "localllm.received_ns"
"""The ASGI scope key of a request's arrival (``perf_counter_ns``), stamped as uvicorn's
httptools protocol begins parsing the request (:mod:`.httphead`; else by the app's outermost
middleware)."""

ENGINE_PHASES = ("wait", "prefill", "sample", "detokenize", "relay")
"""The engine's share split up: waiting in the runner for a slot, the prefill steps up to
the first token's logits, sampling it, detokenizing it, and the way back to the daemon."""

PHASES = (
    "parse",
    "plan",
    "queue",
    "load",
    "handover",
    "template",
    "tokenize",
    *ENGINE_PHASES,
    "out",
)
"""Every phase of the first token, in the order they happen: ``parse`` (HTTP, the JSON body,
its validation and the family's decoding, from the request's arrival), ``plan`` (the request
core: options, tools, sampling), ``queue`` (waiting for a slot in the daemon), ``load`` (the
model's load, when it was not loaded), ``handover`` (the prompt's trip to the runner and the
acceptance's back), ``template``, ``tokenize``, the engine's (:data:`ENGINE_PHASES`), and
``out`` (the first token's text from its arrival in the daemon to the first byte out)."""

_NS_PER_MS = 1_000_000


def server_timing(durations: Mapping[str, float]) -> str:
    """A ``Server-Timing`` header value: ``parse;dur=0.41, template;dur=1.2, ...`` (ms)."""
    return ", ".join(f"{name};dur={ms:.3f}" for name, ms in durations.items())


class FirstToken:
    """The clock of one request's first token: stamps (``perf_counter_ns``) and the runner's
    reported durations, turned into phase durations in milliseconds."""

    __slots__ = (
        "accepted",
        "acquired",
        "first_chunk",
        "load_ms",
        "out_at",
        "planned",
        "planning",
        "received",
        "runner_read",
        "runner_ready",
        "runner_wait_ms",
        "sent",
        "template_ms",
        "tokenize_ms",
    )

    def __init__(self, received: int | None = None) -> None:
        now = time.perf_counter_ns()
        self.received = received if received is not None else now
        """When the request arrived (the HTTP server handed it to the app)."""
        self.planning = now
        """When the request core began planning it (the family had decoded it)."""
        self.planned = now
        """When the plan was done."""
        self.acquired = 0
        """When a slot was held (the model loaded if it had to be)."""
        self.load_ms = 0.0
        """Of the wait for a slot, the model's load."""
        self.sent = 0
        """When the prompt was sent to the runner."""
        self.accepted = 0
        """When the runner's acceptance of the prompt arrived."""
        self.template_ms = 0.0
        """The runner's template render."""
        self.tokenize_ms = 0.0
        """The runner's tokenizing."""
        self.runner_read = 0
        """When the runner read the prompt (its stamp, on the same clock; 0: not known)."""
        self.runner_ready = 0
        """When the runner accepted it (its stamp; 0: not known)."""
        self.runner_wait_ms = -1.0
        """The engine's wait for a slot as the runner measured it (its final timings'
        ``queued_ms`` before the daemon adds its own wait to it; negative: not known)."""
        self.first_chunk = 0
        """When the first generated text arrived from the runner."""
        self.out_at = 0
        """When the first byte went out (or the whole reply, not streamed)."""

    @staticmethod
    def now() -> int:
        """The clock every stamp is read from."""
        return time.perf_counter_ns()

    def _ms(self, start: int, end: int) -> float:
        return max(end - start, 0) / _NS_PER_MS if start and end else 0.0

    def durations(self, timings: Timings | None = None) -> dict[str, float]:
        """The phases known so far, in order, in ms. With the runner's final ``timings``
        the engine's share is split (:data:`ENGINE_PHASES`); without, it is one ``engine``
        phase. Ends with ``ttft``, the sum (arrival to first byte)."""
        out: dict[str, float] = {
            "parse": self._ms(self.received, self.planning),
            "plan": self._ms(self.planning, self.planned),
        }
        held = self._ms(self.planned, self.acquired)
        out["queue"] = max(held - self.load_ms, 0.0)
        out["load"] = min(self.load_ms, held)
        # The runner's stamps say when the engine got the prompt; the daemon may read the
        # acceptance much later (the engine's prefill holds the cores meanwhile), which is
        # the engine's time, not the hand-over's. Without them, the daemon's round trip.
        stamped = self.sent <= self.runner_read <= self.runner_ready <= (self.accepted or 0)
        accepted = self.runner_ready if stamped and self.runner_read else self.accepted
        trip = self._ms(self.sent, accepted)
        runner = self.template_ms + self.tokenize_ms
        # the slot was held → sent gap (adapters, request assembly) counts as hand-over too
        out["handover"] = max(trip - runner, 0.0) + self._ms(self.acquired, self.sent)
        out["template"] = self.template_ms
        out["tokenize"] = self.tokenize_ms
        engine = self._ms(accepted, self.first_chunk)
        if timings is not None and timings.ttft_ms:
            # The final timings' queued_ms counts the daemon's wait too (the API's queued
            # time); the engine's share is the runner's own, kept before it was added.
            wait = self.runner_wait_ms if self.runner_wait_ms >= 0 else timings.queued_ms
            split = {
                "wait": wait,
                "prefill": timings.prompt_ms,
                "sample": timings.sample_ms,
                "detokenize": timings.detokenize_ms,
            }
            out.update(split)
            out["relay"] = max(engine - sum(split.values()), 0.0)
        else:
            out["engine"] = engine
        out["out"] = self._ms(self.first_chunk, self.out_at or self.now())
        out["ttft"] = sum(out.values())
        return out

    def header(self, timings: Timings | None = None) -> str:
        """The ``Server-Timing`` value of :meth:`durations`; the first byte goes out now."""
        if not self.out_at:
            self.out_at = self.now()
        return server_timing(self.durations(timings))
