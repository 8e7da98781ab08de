"""The reference for the runner on a real model: the least code that greedy-decodes with
llama.cpp's low-level API, run in the test's own process (engine/test_runner_smollm2.py compares
a stream with it, api/test_api_scoring.py its log probabilities)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from localllm.daemon.devices import backends, cpu
from localllm.daemon.runner import RunnerConfig

__all__ = ["PlainLoop"]


class PlainLoop:
    """The reference: the least code that greedy-decodes with llama.cpp's low-level API.

    One model, one context created with a runner's parameters (cells, sequences, batch,
    threads, unified F16 KV cache, flash attention auto), one prompt in one batch, then one
    token per ``llama_decode``, a bare greedy sampler, stop at end-of-generation.
    """

    def __init__(self, path: Path, config: RunnerConfig) -> None:
        llama_cpp.llama_backend_init()
        model_params = cpu.model_params()  # weight repacking as this CPU allows
        model_params.n_gpu_layers = 999 if backends.has_local_gpu() else 0
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        assert self.model, "llama.cpp could not load the model"
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = config.n_slots * config.n_ctx_per_slot
        params.n_seq_max = config.n_slots
        params.n_batch = params.n_ubatch = config.n_batch
        params.n_threads = params.n_threads_batch = config.n_threads
        params.kv_unified = True
        params.type_k = params.type_v = llama_cpp.GGML_TYPE_F16
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        params.no_perf = True
        self.n_batch = config.n_batch
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        assert self.ctx, "llama.cpp could not create the context"

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        tokens = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), tokens, len(data) + 8, True, True
        )
        assert count >= 0
        return list(tokens[:count])

    def piece(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(256)
        count = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, False)
        assert count >= 0
        return buffer.raw[:count]

    def greedy(self, prompt: str, max_tokens: int) -> tuple[list[int], list[int], str]:
        """(prompt tokens, generated tokens, generated text) of a greedy completion."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        tokens = self.tokenize(prompt)
        assert 0 < len(tokens) <= self.n_batch
        batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
        generated: list[int] = []
        try:

            def run(items: list[int], start: int) -> None:
                batch.n_tokens = len(items)
                for i, token in enumerate(items):
                    batch.token[i] = token
                    batch.pos[i] = start + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = i == len(items) - 1
                assert llama_cpp.llama_decode(self.ctx, batch) == 0

            run(tokens, 0)
            while len(generated) < max_tokens:
                token = int(llama_cpp.llama_sampler_sample(sampler, self.ctx, -1))
                if llama_cpp.llama_vocab_is_eog(self.vocab, token):
                    break
                generated.append(token)
                run([token], len(tokens) + len(generated) - 1)
        finally:
            llama_cpp.llama_sampler_free(sampler)
            llama_cpp.llama_batch_free(batch)
        text = b"".join(self.piece(t) for t in generated).decode("utf-8", errors="replace")
        return tokens, generated, text

    def close(self) -> None:
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)
