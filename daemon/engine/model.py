"""llama.cpp, loaded: one model, one generation context, the batch, tokenization.

This is the only module of the runner that calls llama.cpp's model/context functions (the
sampler chain lives in :mod:`.sampling`). Everything here runs in the runner process; the
generation context is used from the engine thread only.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import llama_cpp

from ..devices.allocations import allocated
from ..devices.backends import has_local_gpu
from ..devices.cpu import decide, default_threads
from ..runner.protocol import RunnerConfig
from . import tokencache
from .interrupt import DecodeInterrupt
from .params import ModelLoadError, set_fields

if TYPE_CHECKING:
    from ..devices.rpc import RemoteSplit

__all__ = [
    "Batch",
    "LlamaModel",
    "ModelLoadError",
    "batch_size",
    "context_params",
    "default_threads",
    "load_model",
    "model_params",
    "route_llama_log",
    "set_fields",
    "tap_llama_log",
]

_KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}
# (use_mmap, use_mlock) → llama.cpp's load mode. AUTO maps the file where that pays (llama.cpp's
# default); NONE reads it into memory.
_LOAD_MODES = {
    (True, False): llama_cpp.LLAMA_LOAD_MODE_AUTO,
    (False, False): llama_cpp.LLAMA_LOAD_MODE_NONE,
    (True, True): llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK,
    (False, True): llama_cpp.LLAMA_LOAD_MODE_MLOCK,
}
_FLASH = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
log = logging.getLogger("localllm.runner.model")

# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continues the previous line.
_LOG_DEBUG, _LOG_CONT = 1, 5


# The C callback must stay referenced for as long as llama.cpp may call it.
_log_state: dict[str, object] = {}
# Lists collecting log lines for tap_llama_log.
_log_taps: list[list[str]] = []
# Lines held back per thread while hold_llama_log runs there.
_log_holds: dict[int, list[str]] = {}


def route_llama_log(stream: IO[str], debug: bool = False) -> None:
    """Send llama.cpp's log to ``stream`` (the runner's log file) instead of the terminal."""
    lock = threading.Lock()
    last_level = [1]

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        effective = last_level[0] if level == _LOG_CONT else level
        last_level[0] = effective
        for tap in _log_taps:
            tap.append(text.decode("utf-8", errors="replace"))
        if effective == _LOG_DEBUG and not debug:
            return
        held = _log_holds.get(threading.get_ident())
        if held is not None:
            held.append(text.decode("utf-8", errors="replace"))
            return
        write(text.decode("utf-8", errors="replace"))

    def write(text: str) -> None:
        with lock:
            stream.write(text)
            stream.flush()

    _log_state["callback"] = callback
    _log_state["write"] = write
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


def cpu_repack(config: RunnerConfig) -> bool:
    """Whether ``config``'s weights go into llama.cpp's extra CPU buffer types (repacked): as
    it says, else as the CPU probe decided (:func:`.cpu.decide`); raises
    :class:`ModelLoadError` where llama.cpp cannot run on this CPU at all."""
    if config.cpu_repack is not None:
        return config.cpu_repack
    decision = decide(threads=config.n_threads or default_threads())
    if decision.error:
        raise ModelLoadError(decision.error)
    return decision.repack


def model_params(config: RunnerConfig, n_gpu_layers: int) -> llama_cpp.llama_model_params:
    """llama.cpp's model parameters for ``config`` with ``n_gpu_layers`` offloaded."""
    params = llama_cpp.llama_model_default_params()
    set_fields(
        params,
        n_gpu_layers=n_gpu_layers,
        main_gpu=config.main_gpu,
        load_mode=_LOAD_MODES[config.use_mmap, config.use_mlock],
        use_extra_bufts=cpu_repack(config),
    )
    return params


def load_model(
    config: RunnerConfig, params: llama_cpp.llama_model_params
) -> llama_cpp.llama_model_p | None:
    """Load ``config``'s GGUF (all its parts) with ``params``; None when llama.cpp refuses."""
    if config.extra_model_paths:
        # Split GGUF parts are content-addressed blobs, not named -0000i-of-0000n side by
        # side, so llama.cpp is given the list.
        paths = [p.encode() for p in (config.model_path, *config.extra_model_paths)]
        array = (ctypes.c_char_p * len(paths))(*paths)
        return llama_cpp.llama_model_load_from_splits(array, len(paths), params)
    return llama_cpp.llama_model_load_from_file(config.model_path.encode(), params)


def batch_size(config: RunnerConfig) -> int:
    """Tokens per decode for ``config``: every generating slot puts one token in each step's
    batch, and llama.cpp wants a batch at least as large as the sequences (the slots, the
    prefill-ahead ones and the scratch one), so a smaller ``n_batch`` is raised, as
    llama.cpp's own tools clamp out-of-range settings (health reports the value used)."""
    n_batch = max(config.n_batch, config.n_slots + config.n_ahead + 1)
    if n_batch != config.n_batch:
        ahead = f" and {config.n_ahead} prefill-ahead sequences" if config.n_ahead else ""
        log.warning(
            "num_batch %d is below the %d parallel slots%s plus one; using %d",
            config.n_batch,
            config.n_slots,
            ahead,
            n_batch,
        )
    return n_batch


def kv_layout(config: RunnerConfig) -> tuple[bool, int, int]:
    """How ``config``'s KV cache is laid out: (unified, cells, sequences). Unified (one pool
    for all sequences, plus a scratch sequence) only when a pool smaller than slots x context
    was asked for (``kv_cells``); else one stream of ``n_ctx_per_slot`` cells per slot.
    The ``n_ahead`` sequences (see :mod:`.ahead`) come after them, a stream each likewise."""
    full = config.n_ctx_per_slot * config.n_slots
    if 0 < config.kv_cells < full:
        return True, config.kv_cells, config.n_slots + 1 + config.n_ahead
    sequences = config.n_slots + config.n_ahead
    return False, config.n_ctx_per_slot * sequences, sequences


def context_params(
    config: RunnerConfig, n_ctx: int, n_seq: int, n_threads: int, *, unified: bool = True
) -> llama_cpp.llama_context_params:
    """Context parameters for ``config``: ``n_ctx`` cells for ``n_seq`` sequences, in one pool
    (``unified``) or a stream each (the batch size is the caller's)."""
    params = llama_cpp.llama_context_default_params()
    set_fields(
        params,
        n_ctx=n_ctx,
        n_seq_max=n_seq,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        # Unified: one cache for all sequences (llama_memory_seq_cp tags cells with more
        # sequence ids instead of copying them); else n_ctx / n_seq cells per sequence.
        kv_unified=unified,
        type_k=_KV_TYPES[config.kv_cache_type],
        type_v=_KV_TYPES[config.kv_cache_type],
        flash_attn_type=_FLASH[config.flash_attention],
        no_perf=True,
    )
    return params


@contextlib.contextmanager
def tap_llama_log() -> Iterator[list[str]]:
    """Collect llama.cpp's log lines while the block runs (they still reach the runner's
    log): what it reports of buffers it only pretended to allocate (``no_alloc``) is read
    from them."""
    lines: list[str] = []
    _log_taps.append(lines)
    try:
        yield lines
    finally:
        _log_taps.remove(lines)


@contextlib.contextmanager
def hold_llama_log() -> Iterator[list[str]]:
    """Hold back what llama.cpp logs from this thread while the block runs; the caller
    passes the lines on with :func:`release_llama_log` or drops them (an idle decode stopped
    for a request logs a failed graph, which is no failure)."""
    lines: list[str] = []
    thread = threading.get_ident()
    _log_holds[thread] = lines
    try:
        yield lines
    finally:
        del _log_holds[thread]


def release_llama_log(lines: list[str]) -> None:
    """Write lines held by :func:`hold_llama_log` to the runner's log after all."""
    write = _log_state.get("write")
    if callable(write):
        for line in lines:
            write(line)


class Batch:
    """A ``llama_batch`` with a Python-side fill pointer."""

    def __init__(self, capacity: int, n_seq_max: int) -> None:
        self.capacity = capacity
        """Most tokens one batch holds (n_batch)."""
        self.raw = llama_cpp.llama_batch_init(capacity, 0, n_seq_max)
        self.size = 0
        """Tokens added since the last :meth:`clear`."""

    def clear(self) -> None:
        """Empty the batch."""
        self.size = 0
        self.raw.n_tokens = 0

    @property
    def free(self) -> int:
        """Room left."""
        return self.capacity - self.size

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token; returns its index in the batch (for reading its logits)."""
        index = self.size
        if index >= self.capacity:  # writing past the C arrays would corrupt memory
            raise IndexError(f"the batch holds {self.capacity} tokens")
        raw = self.raw
        raw.token[index] = token
        raw.pos[index] = pos
        raw.n_seq_id[index] = 1
        raw.seq_id[index][0] = seq_id
        raw.logits[index] = logits
        self.size = index + 1
        raw.n_tokens = self.size
        return index

    def close(self) -> None:
        """Free the C arrays."""
        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


@dataclass(frozen=True)
class FimTokens:
    """Fill-in-the-middle control tokens, when the vocabulary has them."""

    prefix: int
    suffix: int
    middle: int


class LlamaModel:
    """A loaded model with its generation context and batch."""

    def __init__(self, config: RunnerConfig) -> None:
        llama_cpp.llama_backend_init()
        self.config = config
        """How it was loaded."""
        self.n_threads = config.n_threads or default_threads()
        """The most CPU threads decoding and prefill use (the governor may use fewer)."""
        self.threads_now = self.n_threads
        """The CPU threads the contexts use now (:meth:`set_threads`)."""
        # Not llama_supports_gpu_offload(): it is true in every build with the RPC backend,
        # GPU or none.
        self.gpu_offload = has_local_gpu()
        """Whether this machine has a GPU that llama.cpp can offload to."""

        self.cpu_repack = cpu_repack(config)
        """Whether weights went into llama.cpp's extra CPU buffer types (repacked)."""
        if config.n_gpu_layers < 0:
            self.n_gpu_layers = 999 if self.gpu_offload else 0
        else:
            self.n_gpu_layers = config.n_gpu_layers if self.gpu_offload else 0
        params = model_params(config, self.n_gpu_layers)
        self.remote: RemoteSplit | None = None
        """The RPC workers the model is split onto, with its layers per device."""
        if config.rpc_workers:
            from ..devices.rpc import split_onto_workers

            self.remote = split_onto_workers(params, config)
            self.n_gpu_layers = self.remote.placement.n_gpu_layers
        with tap_llama_log() as load_log:
            self.model = load_model(config, params)
        if not self.model:
            raise ModelLoadError(
                f"llama.cpp could not load {config.model_path} (see the log above)"
            )
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self.model))
        self.n_embd = int(llama_cpp.llama_model_n_embd(self.model))
        self.n_slots = config.n_slots
        """Parallel sequences."""
        self.n_ctx_per_slot = config.n_ctx_per_slot
        """Tokens each slot may hold."""

        self.unified_kv, n_ctx, n_seq = kv_layout(config)
        """One KV cache for all sequences (a pool smaller than slots x context was asked for),
        else one KV stream per slot, as llama-server keeps them: a sequence's attention then
        spans only its own cells, never other slots' (idle ones included), and prefixes move
        between slots by copying a stream (:meth:`seq_copy`)."""
        # A unified cache has one sequence more than the slots: a scratch sequence, for
        # measuring decode costs (with streams it would cost a whole stream; a free slot
        # serves instead).
        self.scratch_seq: int | None = config.n_slots if self.unified_kv else None
        """The sequence for measurements, when there is one."""
        self.interrupt = DecodeInterrupt()
        """Raised when work arrives: stops a :meth:`decode_unless_interrupted` under way."""
        params = context_params(config, n_ctx, n_seq, self.n_threads, unified=self.unified_kv)
        n_batch = batch_size(config)
        set_fields(params, n_batch=n_batch, n_ubatch=n_batch)
        with tap_llama_log() as context_log:
            self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise ModelLoadError("llama.cpp could not create the context (out of memory?)")
        self.allocated = allocated("".join(load_log + context_log))
        """Bytes the load allocated per device (``CPU``: the host), as llama.cpp logged them."""
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.can_shift = bool(llama_cpp.llama_memory_can_shift(self.memory))
        """Whether the KV cache can move positions (context shift); not for every model."""
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        """KV cells in total (shared by all slots: the cache is unified)."""
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.batch = Batch(self.n_batch, config.n_slots)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.bos_id = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos_id = int(llama_cpp.llama_vocab_eos(self.vocab))
        fim = (
            int(llama_cpp.llama_vocab_fim_pre(self.vocab)),
            int(llama_cpp.llama_vocab_fim_suf(self.vocab)),
            int(llama_cpp.llama_vocab_fim_mid(self.vocab)),
        )
        self.fim = FimTokens(*fim) if min(fim) >= 0 else None
        """FIM tokens, or ``None`` when the model cannot fill in the middle."""
        # Pieces are read on the engine thread and, for templates, on worker threads: one
        # scratch buffer per thread.
        self._scratch = threading.local()
        self._pieces: tokencache.PieceCache | None = None
        """Pieces of prompts tokenized before (see :mod:`.tokencache`), once prepared."""
        self._pieces_steps: Generator[None, None, tokencache.PieceCache | None] | None = None
        self._pieces_done = False
        self._embedding_ctx: llama_cpp.llama_context_p | None = None
        self._embedding_batch: Batch | None = None
        self._rank_ctx: llama_cpp.llama_context_p | None = None
        self.rank_pooling = (
            llama_cpp.llama_pooling_type(self.ctx) == llama_cpp.LLAMA_POOLING_TYPE_RANK
        )
        """Whether the GGUF declares rank pooling (a reranker: a classifier head scores a
        query and document joined in one sequence)."""
        template = llama_cpp.llama_model_chat_template(self.model, b"rerank")
        self.rerank_template = template.decode("utf-8", errors="replace") if template else None
        """The GGUF's rerank prompt (``{query}`` and ``{document}`` in it), if it has one."""
        self._embd_batch: llama_cpp.llama_batch | None = None

    # -- metadata --------------------------------------------------------------------------

    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``."""
        raw = llama_cpp.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def token_text(self, token: int) -> str:
        """The vocabulary entry of ``token`` as text (for bos/eos in templates)."""
        if token < 0:
            return ""
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    def describe(self) -> str:
        """llama.cpp's one-line model description (architecture, size, type)."""
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.model, buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace")

    # -- tokens --------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        """Tokenize ``text``; ``add_special`` adds BOS when the model wants one. With special
        tokens parsed, pieces of texts seen before come from :mod:`.tokencache` (the same
        tokens) once it is made (:meth:`prepare_pieces_step`)."""
        if parse_special:
            pieces = self._pieces
            if pieces is not None:
                return pieces.tokenize(text, add_special)
        return self.tokenize_whole(text, add_special, parse_special)

    def prepare_pieces_step(self) -> bool:
        """One step (~1 ms) of making the prompt pieces cache; False once it is made (or
        cannot be). The engine thread calls it while no request waits: made beside a
        request, it took a core from that request's prefill (see :func:`.tokencache.prepare`)."""
        if self._pieces_done:
            return False
        if self._pieces_steps is None:
            templates = "\n".join(filter(None, [self.config.chat_template, self.chat_template()]))

            def whole(text: str, add_special: bool) -> list[int]:
                return self.tokenize_whole(text, add_special, parse_special=True)

            self._pieces_steps = tokencache.prepare(self.vocab, templates, whole)
        try:
            next(self._pieces_steps)
            return True
        except StopIteration as made:
            self._pieces = made.value
        except Exception:  # a cache that could not be made: tokenize whole texts
            log.exception("could not prepare the prompt pieces cache")
        self._pieces_steps, self._pieces_done = None, True
        return False

    def tokenize_whole(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        """llama.cpp's tokens of the whole ``text`` (no cache)."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), tokens, capacity, add_special, parse_special
        )
        if count < 0:
            capacity = -count
            tokens = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), tokens, capacity, add_special, parse_special
            )
        return list(tokens[:count])

    def piece(self, token: int, special: bool = False) -> bytes:
        """Bytes of one token (possibly part of a UTF-8 character)."""
        buffer = getattr(self._scratch, "piece", None)
        if buffer is None:
            buffer = self._scratch.piece = ctypes.create_string_buffer(256)
        count = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, special)
        if count < 0:
            buffer = ctypes.create_string_buffer(-count)
            count = llama_cpp.llama_token_to_piece(
                self.vocab, token, buffer, len(buffer), 0, special
            )
        return buffer.raw[:count]

    def rank_tokens(self, query: str, document: str) -> list[int]:
        """A query and a document as one sequence for the rank head, as llama-server joins
        them: in the GGUF's rerank prompt when it has one, else [BOS] query [EOS] [SEP]
        document [EOS] (each marker where the vocabulary asks for it)."""
        if self.rerank_template is not None:
            prompt = self.rerank_template.replace("{query}", query)
            prompt = prompt.replace("{document}", document)
            return self.tokenize(prompt, add_special=False, parse_special=True)
        vocab = self.vocab
        sep = int(llama_cpp.llama_vocab_sep(vocab))
        end = self.eos_id if self.eos_id >= 0 else sep
        add_eos = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
        tokens = [self.bos_id] if self.add_bos else []
        tokens += self.tokenize(query, add_special=False, parse_special=False)
        tokens += [end] if add_eos else []
        tokens += [sep] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
        tokens += self.tokenize(document, add_special=False, parse_special=False)
        tokens += [end] if add_eos else []
        return tokens

    def detokenize(self, tokens: list[int]) -> str:
        """The text of ``tokens`` (special tokens rendered); ids outside the vocabulary are an
        error, never passed to llama.cpp."""
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token {bad[0]} is not in the vocabulary (0..{self.n_vocab - 1})")
        data = b"".join(self.piece(t, special=True) for t in tokens)
        return data.decode("utf-8", errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        """EOS, EOT and the like."""
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    # -- the KV cache --------------------------------------------------------------------

    def seq_remove(self, seq_id: int, start: int, end: int = -1) -> bool:
        """Drop cells of ``seq_id`` with positions in ``[start, end)`` (end -1 = to the end)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq_id, start, end))

    def seq_copy(self, source: int, destination: int, start: int, end: int) -> None:
        """Give ``destination`` the cells of ``source`` at positions ``[start, end)``, where
        ``destination`` holds ``[0, start)`` of the same tokens already.

        In a unified cache the cells are tagged with ``destination`` too (nothing is copied).
        With a stream per slot llama.cpp copies only whole streams: ``destination``'s stream
        becomes a copy of ``source``'s (at the next decode, on the device) and loses the cells
        from ``end`` on.
        """
        if self.unified_kv:
            llama_cpp.llama_memory_seq_cp(self.memory, source, destination, start, end)
            return
        llama_cpp.llama_memory_seq_cp(self.memory, source, destination, -1, -1)
        llama_cpp.llama_memory_seq_rm(self.memory, destination, end, -1)

    def seq_state(self, seq_id: int) -> bytes:
        """The KV state of ``seq_id`` (its cells' keys and values), for saving elsewhere."""
        size = int(llama_cpp.llama_state_seq_get_size(self.ctx, seq_id))
        if size <= 0:
            return b""
        buffer = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data(self.ctx, buffer, size, seq_id))
        return bytes(buffer)[:written]

    def restore_seq_state(self, seq_id: int, data: bytes) -> bool:
        """Load a state saved by :meth:`seq_state` into ``seq_id`` (emptied first); False
        when llama.cpp refuses it (another model or layout, or no room)."""
        self.seq_remove(seq_id, 0)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        read = int(llama_cpp.llama_state_seq_set_data(self.ctx, buffer, len(data), seq_id))
        if read == 0:
            self.seq_remove(seq_id, 0)
        return read > 0

    def seq_pos_max(self, seq_id: int) -> int:
        """The highest position ``seq_id`` holds a cell for (-1 when it holds none)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id))

    def seq_shift(self, seq_id: int, start: int, end: int, delta: int) -> None:
        """Add ``delta`` to the positions of ``seq_id``'s cells in ``[start, end)``."""
        llama_cpp.llama_memory_seq_add(self.memory, seq_id, start, end, delta)

    def set_threads(self, threads: int) -> None:
        """CPU threads for every later decode, of any batch size, in each of the model's
        contexts (the CPU governor changes them between steps)."""
        if threads == self.threads_now:
            return
        self.threads_now = threads
        for ctx in (self.ctx, self._embedding_ctx, self._rank_ctx):
            if ctx:
                llama_cpp.llama_set_n_threads(ctx, threads, threads)

    def decode(self) -> int:
        """Run the batch through the model; 0 ok, 1 no KV room, other values errors.

        On an asynchronous backend (a GPU) it returns once the work is queued: reading the
        logits waits for it, and so does :meth:`synchronize`."""
        return int(llama_cpp.llama_decode(self.ctx, self.batch.raw))

    def decode_unless_interrupted(self) -> int:
        """:meth:`decode` for work that may wait (measurements while idle): 2 when
        :attr:`interrupt` was raised before or during it (a request arrived), the batch's
        cells then removed again; a decode that cannot be stopped here runs to its end."""
        with hold_llama_log() as held:
            status = self.interrupt.decode(self.ctx, self.batch.raw)
        if status != 2:
            release_llama_log(held)
        return status

    def synchronize(self) -> None:
        """Wait until the device has finished this context's decodes (a clock read after a
        decode measures it only then; on the CPU a decode has finished when it returns)."""
        llama_cpp.llama_synchronize(self.ctx)

    def decode_embeddings(
        self,
        data: ctypes.Array[ctypes.c_float],
        n_tokens: int,
        position: int,
        seq_id: int,
        logits_last: bool,
        non_causal: bool = False,
    ) -> tuple[int, int]:
        """Decode ``n_tokens`` input embeddings (an image's) into ``seq_id`` from ``position``,
        in batches of at most n_batch; ``logits_last`` computes logits for the last one.
        Returns llama_decode's status (0 ok, 1 no KV room) and the batch index of the last
        embedding's logits. ``non_causal`` lets the embeddings attend to each other both ways
        (they must then fit in one batch)."""
        n_embd = int(llama_cpp.llama_model_n_embd_inp(self.model))
        if self._embd_batch is None:
            self._embd_batch = llama_cpp.llama_batch_init(self.n_batch, n_embd, 1)
        raw = self._embd_batch
        floats = ctypes.sizeof(ctypes.c_float) * n_embd
        base = ctypes.addressof(data)
        embd = ctypes.addressof(raw.embd.contents)
        status, index = 0, -1
        if non_causal:
            llama_cpp.llama_set_causal_attn(self.ctx, False)
        try:
            for start in range(0, n_tokens, self.n_batch):
                count = min(self.n_batch, n_tokens - start)
                ctypes.memmove(embd, base + start * floats, count * floats)
                for i in range(count):
                    raw.pos[i] = position + start + i
                    raw.n_seq_id[i] = 1
                    raw.seq_id[i][0] = seq_id
                    raw.logits[i] = logits_last and start + i == n_tokens - 1
                raw.n_tokens = count
                status = int(llama_cpp.llama_decode(self.ctx, raw))
                if status != 0:
                    return status, -1
                index = count - 1
        finally:
            if non_causal:
                llama_cpp.llama_set_causal_attn(self.ctx, True)
        return status, index

    # -- embeddings ----------------------------------------------------------------------

    embed_batch_sequences = 16
    """Most inputs embedded by one decode of the embedding context."""

    def embed(self, tokens: list[int]) -> list[float]:
        """Mean-pooled embedding of one token sequence."""
        return self.embed_many([tokens])[0]

    def _pooled_context(self, pooling: int) -> llama_cpp.llama_context_p:
        params = context_params(
            self.config, self.n_ctx_per_slot, self.embed_batch_sequences, self.threads_now
        )
        # Non-causal (encoder) models need every token of a sequence in one ubatch.
        set_fields(
            params,
            embeddings=True,
            pooling_type=pooling,
            n_batch=self.n_ctx_per_slot,
            n_ubatch=self.n_ctx_per_slot,
            type_k=llama_cpp.GGML_TYPE_F16,
            type_v=llama_cpp.GGML_TYPE_F16,
        )
        ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not ctx:
            raise ModelLoadError("llama.cpp could not create the embedding context")
        return ctx

    def embed_many(
        self,
        sequences: list[list[int]],
        rank: bool = False,
        prepare: Callable[[llama_cpp.llama_context_p], None] | None = None,
    ) -> list[list[float]]:
        """Mean-pooled embeddings of several sequences in one decode (at most
        :attr:`embed_batch_sequences`, their tokens together at most the context per slot);
        ``rank``: each sequence's relevance score instead (rank pooling: the classifier head,
        one number per label, the first the score). The contexts are created on first use;
        ``prepare`` is given the context before the decode (to set its LoRA adapters)."""
        if len(sequences) > self.embed_batch_sequences:
            raise ValueError(f"at most {self.embed_batch_sequences} sequences per batch")
        if self._embedding_batch is None:
            self._embedding_batch = Batch(self.n_ctx_per_slot, 1)
        if rank:
            if self._rank_ctx is None:
                self._rank_ctx = self._pooled_context(llama_cpp.LLAMA_POOLING_TYPE_RANK)
            ctx = self._rank_ctx
        else:
            if self._embedding_ctx is None:
                self._embedding_ctx = self._pooled_context(llama_cpp.LLAMA_POOLING_TYPE_MEAN)
            ctx = self._embedding_ctx
        batch = self._embedding_batch
        assert batch is not None
        if prepare is not None:
            prepare(ctx)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        batch.clear()
        for seq_id, tokens in enumerate(sequences):
            for position, token in enumerate(tokens):
                batch.add(token, position, seq_id, True)
        if llama_cpp.llama_model_has_encoder(self.model):
            status = llama_cpp.llama_encode(ctx, batch.raw)
        else:
            status = llama_cpp.llama_decode(ctx, batch.raw)
        if status != 0:
            raise RuntimeError(f"llama.cpp failed to embed (status {status})")
        vectors = []
        for seq_id in range(len(sequences)):
            pointer = llama_cpp.llama_get_embeddings_seq(ctx, seq_id)
            if not pointer:
                raise RuntimeError("llama.cpp returned no pooled embedding")
            vectors.append(list(pointer[: 1 if rank else self.n_embd]))
        return vectors

    # -- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        """Free batch, contexts and model, in that order (samplers are freed by their owners)."""
        for batch in (self.batch, self._embedding_batch):
            if batch is not None:
                batch.close()
        if self._embd_batch is not None:
            llama_cpp.llama_batch_free(self._embd_batch)
            self._embd_batch = None
        for pooled in (self._embedding_ctx, self._rank_ctx):
            if pooled is not None:
                llama_cpp.llama_free(pooled)
        self._embedding_ctx = self._rank_ctx = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
