"""Load generation: :func:`run_level` sends N streamed completions at once and returns one
:class:`~.stats.Sample` per request and the level's wall time (``benchmarks/`` drive their
servers with it too); :class:`PromptMaker` makes prompts of a given length in tokens.

The prompts are a greedy raw completion of counting text ("1, 2, 3, ...") with a unique tag in
front of every request, so answers rarely stop early and no request reuses another's prefix
unless asked to. Lengths are hit by measuring the server's characters per token once (a
one-token request, :meth:`PromptMaker.calibrate`) and cutting the text to length.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .drivers import Completion, Driver, describe_error
from .stats import Sample

__all__ = ["PromptMaker", "run_level", "run_one"]

# Short enough for any context (at most about 150 tokens), long enough for a stable ratio.
_CALIBRATION_CHARS = 120


async def run_one(driver: Driver, request: Completion, sample: Sample, origin: float) -> None:
    """Run one request into ``sample`` (``start_s`` counted from ``origin``, a
    ``time.perf_counter()`` reading); failures are recorded, never raised."""
    sent = time.perf_counter()
    first: float | None = None
    last: float | None = None
    chunks = 0

    def on_text(piece: str) -> None:
        nonlocal first, last, chunks
        now = time.perf_counter()
        first = first or now
        last = now
        chunks += 1

    sample.start_s = sent - origin
    try:
        final = await driver.complete(request, on_text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # whatever the server or the network did: a failed sample
        sample.error, sample.status = describe_error(exc)
        sample.chunks = chunks
        return
    done = time.perf_counter()
    sample.ok = True
    sample.chunks = chunks
    sample.duration_s = done - sent
    sample.tokens = final.tokens if final.tokens is not None else chunks
    if first is not None:
        sample.ttft_ms = (first - sent) * 1000
        if last is not None and last > first and sample.tokens >= 2:
            sample.stream_tps = (sample.tokens - 1) / (last - first)
    sample.prompt_tokens = final.prompt_tokens
    sample.cached_tokens = final.cached_tokens
    sample.server_ttft_ms = final.ttft_ms
    sample.queue_ms = final.queue_ms
    sample.load_ms = final.load_ms
    sample.prefill_tps = final.prefill_tps
    sample.server_decode_tps = final.decode_tps
    sample.draft_tokens = final.draft_tokens
    sample.draft_accepted = final.draft_accepted


async def run_level(
    driver: Driver,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    *,
    options: Mapping[str, Any] | None = None,
    template: Sample | None = None,
    origin: float | None = None,
) -> tuple[list[Sample], float]:
    """Send one request per prompt, all at once; returns a :class:`Sample` each (copies of
    ``template`` with ``client`` set) and the wall time from the first send to the last
    answer. Failed requests are samples with ``ok`` false, never exceptions."""
    base = template or Sample(
        target=driver.url, sweep="concurrency", clients=len(prompts), prompt_tokens_target=0
    )
    origin = time.perf_counter() if origin is None else origin
    samples = [dataclasses.replace(base, client=i) for i in range(len(prompts))]
    start = time.perf_counter()
    await asyncio.gather(
        *(
            run_one(driver, Completion(model, prompt, max_tokens, options or {}), sample, origin)
            for prompt, sample in zip(prompts, samples, strict=True)
        )
    )
    return samples, time.perf_counter() - start


def _counting_text(characters: int) -> str:
    """``1, 2, 3, ...`` at least ``characters`` long."""
    parts: list[str] = []
    total = 0
    number = 1
    while total < characters:
        piece = f"{number}, "
        parts.append(piece)
        total += len(piece)
        number += 1
    return "".join(parts)


class PromptMaker:
    """Prompts of about N tokens: a unique tag, then counting text cut to length.

    ``chars_per_token`` comes from :meth:`calibrate` (the server's own count for a known text)
    or a guess. ``nonce`` makes tags unique to this run, so that no prefix saved by an earlier
    run (the daemon keeps them on disk) turns a cold request into a cached one.
    """

    def __init__(self, chars_per_token: float = 2.0, nonce: str | None = None) -> None:
        self.chars_per_token = chars_per_token
        """Characters of counting text per token, for this server's tokenizer."""
        self.nonce = nonce or secrets.token_hex(3)
        """Part of every tag, unique to the run."""
        self._text = _counting_text(4096)

    def make(self, tokens: int, tag: str) -> str:
        """A prompt of about ``tokens`` tokens starting with ``tag`` (make tags unique)."""
        head = f"[{tag} {self.nonce}] "
        # The tag's own tokens count too (about as dense as the rest).
        chars = max(8, int((tokens - len(head) / self.chars_per_token) * self.chars_per_token))
        if len(self._text) < chars:
            self._text = _counting_text(chars * 2)
        body = self._text[:chars]
        # Cut after a comma: the model then keeps counting instead of finishing a number.
        cut = body.rfind(", ")
        return head + (body[: cut + 2] if cut > 0 else body)

    async def calibrate(self, driver: Driver, model: str, options: Mapping[str, Any]) -> bool:
        """Measure characters per token with one one-token request (which also loads the
        model); True when the server reported a prompt token count."""
        prompt = f"[calibrate {self.nonce}] " + self._text[:_CALIBRATION_CHARS]
        final = await driver.complete(Completion(model, prompt, 1, options), lambda piece: None)
        if final.prompt_tokens:
            self.chars_per_token = max(0.5, len(prompt) / final.prompt_tokens)
            return True
        return False
