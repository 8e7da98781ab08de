"""llama.cpp, loaded: one model, one generation context, the batch, tokenization.

This is the only module of the runner that calls llama.cpp's model/context functions (the
sampler chain lives in :mod:`.sampling`). Everything here runs in the runner process; the
generation context is used from the engine thread only.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import llama_cpp

from .protocol import RunnerConfig

__all__ = [
    "Batch",
    "LlamaModel",
    "ModelLoadError",
    "default_threads",
    "route_llama_log",
    "set_fields",
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


class ModelLoadError(RuntimeError):
    """llama.cpp refused to load the model or create its context."""


def set_fields(params: ctypes.Structure, **values: object) -> None:
    """Set fields of a llama.cpp parameter struct, refusing a name the struct lacks.

    ctypes accepts any attribute on a struct, so a field llama.cpp renamed (``use_mmap``
    became ``load_mode``) would otherwise be dropped without a word.
    """
    fields = {name for name, *_ in type(params)._fields_}
    for name, value in values.items():
        if name not in fields:
            raise AttributeError(f"this llama.cpp has no {type(params).__name__}.{name}")
        setattr(params, name, value)


def default_threads() -> int:
    """Physical cores available to this process (llama.cpp gains nothing from SMT siblings)."""
    available = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    try:
        smt_active = Path("/sys/devices/system/cpu/smt/active").read_text().strip() == "1"
    except OSError:
        smt_active = False
    return max(1, available // 2 if smt_active and available > 1 else available)


# The C callback must stay referenced for as long as llama.cpp may call it.
_log_state: dict[str, object] = {}


def route_llama_log(stream: IO[str], debug: bool = False) -> None:
    """Send llama.cpp's log to ``stream`` (the runner's log file) instead of the terminal."""
    lock = threading.Lock()
    last_level = [1]

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        effective = last_level[0] if level == _LOG_CONT else level
        last_level[0] = effective
        if effective == _LOG_DEBUG and not debug:
            return
        with lock:
            stream.write(text.decode("utf-8", errors="replace"))
            stream.flush()

    _log_state["callback"] = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


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
        """CPU threads used for decoding and prefill."""
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        """Whether this llama.cpp build has a GPU backend."""

        model_params = llama_cpp.llama_model_default_params()
        if config.n_gpu_layers < 0:
            self.n_gpu_layers = 999 if self.gpu_offload else 0
        else:
            self.n_gpu_layers = config.n_gpu_layers if self.gpu_offload else 0
        set_fields(
            model_params,
            n_gpu_layers=self.n_gpu_layers,
            main_gpu=config.main_gpu,
            load_mode=_LOAD_MODES[config.use_mmap, config.use_mlock],
        )
        if config.extra_model_paths:
            # Split GGUF parts are content-addressed blobs, not named -0000i-of-0000n side by
            # side, so llama.cpp is given the list.
            paths = [p.encode() for p in (config.model_path, *config.extra_model_paths)]
            array = (ctypes.c_char_p * len(paths))(*paths)
            self.model = llama_cpp.llama_model_load_from_splits(array, len(paths), model_params)
        else:
            self.model = llama_cpp.llama_model_load_from_file(
                config.model_path.encode(), model_params
            )
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

        full = config.n_ctx_per_slot * config.n_slots
        self.unified_kv = 0 < config.kv_cells < full
        """One KV cache for all sequences (a pool smaller than slots x context was asked for),
        else one KV stream per slot, as llama-server keeps them: a sequence's attention then
        spans only its own cells, never other slots' (idle ones included), and prefixes move
        between slots by copying a stream (:meth:`seq_copy`)."""
        # A unified cache has one sequence more than the slots: a scratch sequence, for
        # measuring decode costs (with streams it would cost a whole stream; a free slot
        # serves instead).
        self.scratch_seq: int | None = config.n_slots if self.unified_kv else None
        """The sequence for measurements, when there is one."""
        if self.unified_kv:
            params = self._context_params(config.kv_cells, config.n_slots + 1, unified=True)
        else:
            params = self._context_params(full, config.n_slots, unified=False)
        # Every generating slot puts one token in each step's batch, and llama.cpp wants a
        # batch at least as large as the sequences (the slots and the scratch one): smaller
        # would abort, so clamp as llama.cpp's own tools clamp out-of-range settings, and
        # report the value used in health.
        n_batch = max(config.n_batch, config.n_slots + 1)
        if n_batch != config.n_batch:
            log.warning(
                "num_batch %d is below the %d parallel slots plus one; using %d",
                config.n_batch,
                config.n_slots,
                n_batch,
            )
        set_fields(params, n_batch=n_batch, n_ubatch=n_batch)
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise ModelLoadError("llama.cpp could not create the context (out of memory?)")
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
        self._embedding_ctx: llama_cpp.llama_context_p | None = None
        self._embedding_batch: Batch | None = None
        self._embd_batch: llama_cpp.llama_batch | None = None

    def _context_params(
        self, n_ctx: int, n_seq: int, unified: bool = True
    ) -> llama_cpp.llama_context_params:
        params = llama_cpp.llama_context_default_params()
        set_fields(
            params,
            n_ctx=n_ctx,
            n_seq_max=n_seq,
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads,
            # Unified: one cache for all sequences (llama_memory_seq_cp tags cells with more
            # sequence ids instead of copying them); else n_ctx / n_seq cells per sequence.
            kv_unified=unified,
            type_k=_KV_TYPES[self.config.kv_cache_type],
            type_v=_KV_TYPES[self.config.kv_cache_type],
            flash_attn_type=_FLASH[self.config.flash_attention],
            no_perf=True,
        )
        return params

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
        """Tokenize ``text``; ``add_special`` adds BOS when the model wants one."""
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

    def decode(self) -> int:
        """Run the batch through the model; 0 ok, 1 no KV room, other values errors."""
        return int(llama_cpp.llama_decode(self.ctx, self.batch.raw))

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

    def embed_many(self, sequences: list[list[int]]) -> list[list[float]]:
        """Mean-pooled embeddings of several sequences in one decode (at most
        :attr:`embed_batch_sequences`, their tokens together at most the context per slot).
        The embedding context is created on first use."""
        if len(sequences) > self.embed_batch_sequences:
            raise ValueError(f"at most {self.embed_batch_sequences} sequences per batch")
        if self._embedding_ctx is None:
            params = self._context_params(self.n_ctx_per_slot, self.embed_batch_sequences)
            # Non-causal (encoder) models need every token of a sequence in one ubatch.
            set_fields(
                params,
                embeddings=True,
                pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                n_batch=self.n_ctx_per_slot,
                n_ubatch=self.n_ctx_per_slot,
                type_k=llama_cpp.GGML_TYPE_F16,
                type_v=llama_cpp.GGML_TYPE_F16,
            )
            ctx = llama_cpp.llama_init_from_model(self.model, params)
            if not ctx:
                raise ModelLoadError("llama.cpp could not create the embedding context")
            self._embedding_ctx = ctx
            self._embedding_batch = Batch(self.n_ctx_per_slot, 1)
        ctx = self._embedding_ctx
        batch = self._embedding_batch
        assert batch is not None
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
            vectors.append(list(pointer[: self.n_embd]))
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
        if self._embedding_ctx is not None:
            llama_cpp.llama_free(self._embedding_ctx)
            self._embedding_ctx = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
