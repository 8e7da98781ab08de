"""The conversation workload: a replayed multi-turn trace, more users than slots, a shared
system prompt and histories that grow turn by turn, the traffic where what a server's cache
holds decides how soon the first token comes.

A trace (:class:`Conversation`) is ``users`` conversations of ``turns`` turns each. Every
prompt is a raw completion: the system prompt shared by all users, then the user's earlier
turns with the answers the server gave, then the new question. In each turn every user sends
at once (:func:`run_turn`), so a server with fewer slots than users has to choose who waits;
the answers (whatever the server said) become the next turn's history, as a chat client keeps
them. Each target keeps its own histories.

The texts are counting text (as the other workloads': answers rarely stop early) behind tags
unique to the run, so nothing an earlier run saved is reused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._exceptions import BenchError
from .drivers import Completion, Driver, Final, TextSink
from .load import PromptMaker, run_one
from .stats import Sample

__all__ = ["Conversation", "Histories", "parse_conversation", "run_turn"]


@dataclass
class Conversation:
    """The shape of a conversation trace."""

    users: int = 16
    """Conversations going on at once (more than the server's slots, to be interesting)."""
    turns: int = 3
    """Questions each user asks, one per round."""
    system_tokens: int = 256
    """Length of the system prompt every conversation starts with."""
    turn_tokens: int = 48
    """Length of each question."""

    def check(self) -> None:
        """Refuse a trace that cannot be replayed."""
        if self.users < 1 or self.turns < 1:
            raise BenchError("a conversation needs at least 1 user and 1 turn")
        if self.system_tokens < 1 or self.turn_tokens < 1:
            raise BenchError("a conversation's system prompt and questions need 1 token or more")


def parse_conversation(text: str) -> Conversation:
    """``16x3`` (users × turns) → a :class:`Conversation` with the default lengths."""
    users, sep, turns = text.lower().replace(" ", "").partition("x")
    try:
        shape = Conversation(users=int(users), turns=int(turns) if sep else 3)
    except ValueError:
        raise BenchError(f"a conversation is USERSxTURNS (e.g. 16x3), got {text!r}") from None
    shape.check()
    return shape


@dataclass
class Histories:
    """One target's conversations so far: the text each user's next prompt starts with."""

    shape: Conversation
    prompts: PromptMaker
    tag: str
    """Unique to the target and repetition: nothing is shared across them."""
    texts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        system = self.prompts.make(self.shape.system_tokens, f"system {self.tag}")
        self.texts = [f"{system}\n" for _ in range(self.shape.users)]

    def prompts_for(self, turn: int) -> list[str]:
        """Each user's prompt of ``turn`` (0-based): history, then the new question."""
        return [
            f"{history}### User {user}\n"
            f"{self.prompts.make(self.shape.turn_tokens, f'u{user} t{turn} {self.tag}')}\n"
            "### Assistant\n"
            for user, history in enumerate(self.texts)
        ]

    def answered(self, prompts: Sequence[str], answers: Sequence[str]) -> None:
        """The turn is over: each prompt and its answer are the user's history now."""
        pairs = zip(prompts, answers, strict=True)
        self.texts = [f"{prompt}{answer}\n" for prompt, answer in pairs]


class _Keep(Driver):
    """Passes one request to a driver and keeps the answer's text."""

    def __init__(self, driver: Driver) -> None:
        super().__init__(driver.url)
        self.driver = driver
        self.pieces: list[str] = []

    async def complete(self, request: Completion, on_text: TextSink) -> Final:
        """See :meth:`Driver.complete`."""

        def both(piece: str) -> None:
            self.pieces.append(piece)
            on_text(piece)

        return await self.driver.complete(request, both)


async def run_turn(
    driver: Driver,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    *,
    template: Sample,
    options: Mapping[str, Any] | None = None,
    origin: float | None = None,
) -> tuple[list[Sample], list[str], float]:
    """Send every user's prompt of one turn at once; returns a :class:`Sample` each (copies of
    ``template``, ``client`` the user), the answers' texts (empty for a failed request) and
    the turn's wall time. Failures are samples with ``ok`` false, never exceptions."""
    origin = time.perf_counter() if origin is None else origin
    samples = [dataclasses.replace(template, client=i) for i in range(len(prompts))]
    keepers = [_Keep(driver) for _ in prompts]
    start = time.perf_counter()
    await asyncio.gather(
        *(
            run_one(keep, Completion(model, prompt, max_tokens, options or {}), sample, origin)
            for keep, prompt, sample in zip(keepers, prompts, samples, strict=True)
        )
    )
    wall = time.perf_counter() - start
    return samples, ["".join(keep.pieces) for keep in keepers], wall
