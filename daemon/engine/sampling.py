"""Per-request sampling on llama.cpp's sampler chain.

The chain follows llama.cpp's usual order: penalties → top-k → typical → top-p → min-p →
temperature → distribution (or penalties → greedy at temperature 0). A grammar is kept as a
separate sampler: the penalties must learn the prompt's tokens, and feeding those to a grammar
would advance it, so the two are accepted separately.

The repetition penalties are applied here (:class:`Penalties`), to the few tokens of their
window, rather than by llama.cpp's penalties sampler, which looks every token of the
vocabulary up in its window per sample: 190 µs of the 240 a token took with Ollama's default
options at 49k tokens. The arithmetic is llama.cpp's, in the same float32 operations, so the
same tokens come out.
"""

from __future__ import annotations

import collections
import ctypes
import random
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF

from ..runner.protocol import SamplingOptions
from .jsongrammar import schema_gbnf

__all__ = [
    "MAX_TOP_LOGPROBS",
    "GrammarError",
    "Penalties",
    "Sampler",
    "check_sampling",
    "grammar_for",
    "logits_at",
    "token_logprobs",
]

MAX_TOP_LOGPROBS = 20

_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class GrammarError(ValueError):
    """The grammar or JSON schema cannot be used."""


def grammar_for(options: SamplingOptions) -> str | None:
    """The GBNF grammar a request asks for: explicit GBNF, a JSON schema, or any JSON."""
    if options.grammar:
        return options.grammar
    if options.json_schema is not None:
        try:
            return schema_gbnf(options.json_schema)
        except Exception as exc:  # the converter raises assorted types on bad schemas
            raise GrammarError(f"unsupported JSON schema: {exc}") from None
    if options.json_mode:
        return JSON_GBNF
    return None


def check_sampling(options: SamplingOptions, n_vocab: int) -> None:
    """Refuse options the model cannot honour (``ValueError`` naming the option)."""
    for key, bias in options.logit_bias.items():
        try:
            token = int(key)
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
        if not 0 <= token < n_vocab:
            raise ValueError(
                f"logit_bias names token {token}, outside the vocabulary 0..{n_vocab - 1}"
            )
        if not isinstance(bias, int | float) or bias != bias:
            raise ValueError(f"logit_bias[{key}] must be a number")
    if not 0 <= options.top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")


def logits_at(
    ctx: Any, batch_index: int, n_vocab: int, row: np.ndarray | None = None
) -> np.ndarray:
    """The model's logits for one batch position (a view into llama.cpp's buffer), or
    ``row`` when given (logits kept from an earlier step: see :mod:`.keptlogits`)."""
    if row is not None:
        return row
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, batch_index), shape=(n_vocab,))


def prepare_logits_view(n_vocab: int) -> None:
    """Make the ctypes types :func:`logits_at` views a row of ``n_vocab`` logits through, ahead
    of a first sample: numpy's ``as_array`` makes them at its first call in a process (1.5 ms
    of a fresh runner's first token)."""
    row = (ctypes.c_float * n_vocab)()
    np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))


def token_logprobs(
    logits: np.ndarray, token: int, top: int
) -> tuple[float, list[tuple[int, float]]]:
    """Log probability of ``token`` under softmax(``logits``), and the ``top`` most likely
    tokens with theirs, best first."""
    peak = float(logits.max())
    log_total = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    chosen = float(logits[token]) - log_total
    if top <= 0:
        return chosen, []
    best = np.argpartition(logits, -top)[-top:]
    best = best[np.argsort(logits[best])[::-1]]
    return chosen, [(int(i), float(logits[i]) - log_total) for i in best]


class Penalties:
    """llama.cpp's repetition penalties (``llama_sampler_init_penalties``) over the window of
    the last ``last_n`` accepted tokens, applied only to the tokens in that window.

    A token seen ``count`` times in the window has its logit multiplied by ``repeat`` when
    it is at most 0, else divided by it, then lowered by ``count * frequency + present``.
    """

    def __init__(self, last_n: int, repeat: float, frequency: float, present: float) -> None:
        self.last_n = last_n
        self.repeat = np.float32(repeat)
        self.frequency = np.float32(frequency)
        self.present = np.float32(present)
        self.window: collections.deque[int] = collections.deque()
        self.counts: dict[int, int] = {}
        """Token → its occurrences in the window (only tokens that occur)."""
        self.lowers_only = repeat >= 1 and frequency >= 0 and present >= 0
        """Whether a penalised logit is never above the model's own (a repeat penalty below
        1, or a negative frequency or presence penalty, raises repeated tokens instead)."""

    def accept(self, token: int) -> None:
        """``token`` was sampled (or is part of the prompt): it enters the window, and the
        oldest token leaves a full one."""
        counts = self.counts
        counts[token] = counts.get(token, 0) + 1
        if len(self.window) >= self.last_n:
            old = self.window.popleft()
            if counts[old] == 1:
                del counts[old]
            else:
                counts[old] -= 1
        self.window.append(token)

    def penalised(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The window's token ids and their penalised logits (``logits`` is not changed)."""
        ids = np.fromiter(self.counts.keys(), dtype=np.intp, count=len(self.counts))
        counts = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
        values = logits[ids]
        values = np.where(values <= 0, values * self.repeat, values / self.repeat)
        # float32 throughout, in llama.cpp's order: the same roundings.
        values -= counts * self.frequency + self.present  # every count here is > 0
        return ids, values


class Sampler:
    """A request's sampler chain (and optional grammar)."""

    def __init__(
        self,
        vocab: Any,
        n_vocab: int,
        options: SamplingOptions,
        grammar: str | None,
        context_length: int,
    ) -> None:
        self.n_vocab = n_vocab
        self.chain = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        self.grammar = None
        if grammar is not None and options.grammar_triggers:
            patterns = [p.encode() for p in options.grammar_triggers]
            array = (ctypes.c_char_p * len(patterns))(*patterns)
            self.grammar = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                vocab, grammar.encode(), b"root", array, len(patterns), None, 0
            )
            if not self.grammar:
                self.close()
                raise GrammarError("the grammar or its triggers could not be parsed")
        elif grammar is not None:
            self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not self.grammar:
                self.close()
                raise GrammarError("the grammar could not be parsed (see the runner log)")
        add = self._add
        o = options
        penalised = o.repeat_last_n != 0 and bool(
            o.repeat_penalty != 1.0 or o.frequency_penalty or o.presence_penalty
        )
        self._greedy = grammar is None and o.temperature <= 0 and not o.logit_bias
        """Greedy with nothing but the penalties (if any) changing the logits."""
        self.argmax_only = self._greedy and not penalised
        """Whether the chain is plain greedy (no state, nothing that changes logits): then
        :meth:`sample` takes the largest logit itself instead of asking llama.cpp, which
        copies the whole vocabulary into a candidate array per token (~80 µs at 49k tokens,
        against ~8 µs here: 0.6 ms of every 8-stream step)."""
        if o.logit_bias:
            biases = [(int(k), float(v)) for k, v in o.logit_bias.items()]
            array = (llama_cpp.llama_logit_bias * len(biases))(
                *(llama_cpp.llama_logit_bias(token=t, bias=b) for t, b in biases)
            )
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), array))
        last_n = context_length if o.repeat_last_n < 0 else o.repeat_last_n
        self.penalties: Penalties | None = None
        """The repetition penalties, when applied here (see :class:`Penalties`)."""
        self._chain_penalises = penalised and bool(o.logit_bias)
        """Whether llama.cpp's penalties sampler is in the chain (its only sampler that
        learns from accepted tokens)."""
        if self._chain_penalises:
            # The bias comes first and the penalty depends on the biased logit's sign: this
            # rare combination keeps llama.cpp's own order.
            add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, last_n, o.repeat_penalty, o.frequency_penalty, o.presence_penalty
                )
            )
        elif penalised:
            self.penalties = Penalties(
                last_n, o.repeat_penalty, o.frequency_penalty, o.presence_penalty
            )
        seed = (o.seed if o.seed >= 0 else random.getrandbits(32)) & 0xFFFFFFFF
        if o.temperature <= 0:
            add(llama_cpp.llama_sampler_init_greedy())
        elif o.mirostat:
            # Mirostat replaces the truncations: it picks its own cut each step (as llama.cpp's
            # common sampler does, after the temperature).
            add(llama_cpp.llama_sampler_init_temp(o.temperature))
            if o.mirostat == 1:
                add(
                    llama_cpp.llama_sampler_init_mirostat(
                        n_vocab, seed, o.mirostat_tau, o.mirostat_eta, 100
                    )
                )
            else:
                add(llama_cpp.llama_sampler_init_mirostat_v2(seed, o.mirostat_tau, o.mirostat_eta))
        else:
            if o.top_k > 0:
                add(llama_cpp.llama_sampler_init_top_k(o.top_k))
            if 0 < o.typical_p < 1:
                add(llama_cpp.llama_sampler_init_typical(o.typical_p, 1))
            if 0 < o.top_p < 1:
                add(llama_cpp.llama_sampler_init_top_p(o.top_p, 1))
            if o.min_p > 0:
                add(llama_cpp.llama_sampler_init_min_p(o.min_p, 1))
            add(llama_cpp.llama_sampler_init_temp(o.temperature))
            add(llama_cpp.llama_sampler_init_dist(seed))
        self._token_data: np.ndarray | None = None
        self._token_array: Any = None

    def _add(self, sampler: Any) -> None:
        llama_cpp.llama_sampler_chain_add(self.chain, sampler)

    def learn_prompt(self, tokens: list[int]) -> None:
        """Let the penalties see the prompt (the grammar must not)."""
        if self.penalties is not None:
            for token in tokens:
                self.penalties.accept(token)
        elif self._chain_penalises:
            for token in tokens:
                llama_cpp.llama_sampler_accept(self.chain, token)

    def sample(self, ctx: Any, batch_index: int, row: np.ndarray | None = None) -> int:
        """Pick the next token from the logits at ``batch_index`` (or from ``row``, logits
        kept from an earlier step: see :mod:`.keptlogits`) and accept it."""
        if self.argmax_only:
            # The first largest logit, as llama.cpp's greedy sampler picks (it has no state
            # to accept the token into).
            logits = logits_at(ctx, batch_index, self.n_vocab, row)
            return int(logits.argmax())
        penalties = self.penalties
        if penalties is None:
            return self._sample(ctx, batch_index, row)
        logits = logits_at(ctx, batch_index, self.n_vocab, row)
        if self._greedy:
            token = int(logits.argmax())
            if token in penalties.counts or not penalties.lowers_only:
                # The best token is one the penalties change (or they may raise others):
                # the largest of the penalised logits, put in for this one look.
                ids, values = penalties.penalised(logits)
                original = logits[ids]
                logits[ids] = values
                try:
                    token = int(logits.argmax())
                finally:
                    logits[ids] = original
            # Else it stands: the penalties only lower the window's tokens, and it is not
            # one of them (a tie is the first largest either way).
        else:
            # The chain reads llama.cpp's logits: penalised there for this one sample, then
            # put back (logprobs are of the model's own logits).
            ids, values = penalties.penalised(logits)
            original = logits[ids]
            logits[ids] = values
            try:
                token = self._sample(ctx, batch_index, row)
            finally:
                logits[ids] = original
        penalties.accept(token)
        return token

    def _sample(self, ctx: Any, batch_index: int, row: np.ndarray | None = None) -> int:
        """The chain's (and grammar's) pick from the logits at ``batch_index`` (or ``row``),
        accepted."""
        if self.grammar is None and row is None:
            # Fast path: the whole chain runs in C and accepts the token itself.
            return int(llama_cpp.llama_sampler_sample(self.chain, ctx, batch_index))
        logits = logits_at(ctx, batch_index, self.n_vocab, row)
        data, array = self._candidates()
        data["id"] = np.arange(self.n_vocab, dtype=np.intc)
        data["logit"] = logits
        data["p"] = 0.0
        array.size = self.n_vocab
        array.selected = -1
        array.sorted = False
        pointer = ctypes.byref(array)
        llama_cpp.llama_sampler_apply(self.grammar, pointer)
        llama_cpp.llama_sampler_apply(self.chain, pointer)
        token = int(data["id"][array.selected])
        llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.chain, token)
        return token

    def force(self, token: int) -> bool:
        """Take ``token`` as if it had been sampled (a reasoning budget's close tag); False,
        taking nothing, when the grammar refuses it (accepting a refused token would abort
        llama.cpp)."""
        if self.grammar is not None:
            candidate = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0))
            array = llama_cpp.llama_token_data_array(candidate, 1, -1, False)
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
            if candidate[0].logit == float("-inf"):
                return False
            llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.chain, token)
        if self.penalties is not None:
            self.penalties.accept(token)
        return True

    def _candidates(self) -> tuple[np.ndarray, Any]:
        if self._token_data is None:
            storage = (llama_cpp.llama_token_data * self.n_vocab)()
            self._storage = storage
            self._token_data = np.frombuffer(storage, dtype=_TOKEN_DATA)
            self._token_array = llama_cpp.llama_token_data_array(
                data=storage, size=self.n_vocab, selected=-1, sorted=False
            )
        return self._token_data, self._token_array

    def close(self) -> None:
        """Free the samplers."""
        if self.chain:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None
        if self.grammar:
            llama_cpp.llama_sampler_free(self.grammar)
            self.grammar = None
