"""Write LoRA adapter GGUFs for a base model with ``gguf.GGUFWriter``, as llama.cpp's
``convert_lora_to_gguf.py`` lays them out: ``general.type = adapter``, ``adapter.type = lora``,
``adapter.lora.alpha``, and for each weight it changes a ``<name>.lora_a`` (rank x inputs, in
numpy's order) and a ``<name>.lora_b`` (outputs x rank).

The matrices are random with a fixed seed, large enough that greedy output differs from the
base model's: an adapter made here is a real one for llama.cpp, only not a trained one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import gguf
import numpy as np

__all__ = ["ATTENTION", "base_shapes", "write_lora_gguf"]

ATTENTION = ("attn_q", "attn_k", "attn_v", "attn_output")
"""The usual LoRA targets (as PEFT's q_proj, k_proj, v_proj, o_proj)."""


def base_shapes(base: Path) -> dict[str, tuple[int, ...]]:
    """Every 2-D weight of the GGUF at ``base``: name → shape in ggml's order (inputs first).

    Read with localllm's header reader: gguf.GGUFReader walks a 49k-token vocabulary for
    seconds, and only the tensor table is wanted."""
    from localllm.gguf_info import inspect_gguf

    return {t.name: t.shape for t in inspect_gguf(base).tensors if len(t.shape) == 2}


def write_lora_gguf(
    path: Path,
    base: Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    seed: int = 1,
    targets: Iterable[str] = ATTENTION,
    std: float = 0.05,
    architecture: str = "llama",
    wrong_rank_for: str | None = None,
    extra: dict[str, tuple[int, int]] | None = None,
) -> Path:
    """Write an adapter for the model at ``base`` changing the weights whose name holds one of
    ``targets`` (``blk.N.<target>.weight``); returns ``path``.

    ``wrong_rank_for`` gives that weight's lora_a one input too many (a tensor that does not
    fit); ``extra`` adds weights the base may not have (name → (inputs, outputs)).
    """
    rng = np.random.default_rng(seed)
    wanted = tuple(targets)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    writer.add_name(f"test-lora-{seed}")
    shapes = {
        name: shape
        for name, shape in base_shapes(base).items()
        if any(f".{target}." in name for target in wanted)
    }
    shapes.update(extra or {})
    for name, (n_in, n_out) in shapes.items():
        a_in = n_in + 1 if name == wrong_rank_for else n_in
        lora_a = (rng.standard_normal((rank, a_in)) * std).astype(np.float32)
        lora_b = (rng.standard_normal((n_out, rank)) * std).astype(np.float32)
        writer.add_tensor(f"{name}.lora_a", lora_a)
        writer.add_tensor(f"{name}.lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
