"""Reference forward passes in numpy, written from each family's modeling code in transformers.

Independent of the converter: they read the checkpoint's own HF tensor names and layout
(rotate-half rope, fused Phi-3 projections, Gemma's ``1 + w`` norms), as
``modeling_llama.py``, ``modeling_qwen2.py``, ``modeling_qwen3.py``, ``modeling_gemma2.py``,
``modeling_gemma3.py`` and ``modeling_phi3.py`` compute them, in float32. The converter is right
when llama.cpp, running the GGUF, gives the same logits.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["forward", "llama3_inv_freq"]


def _rms(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * ((1.0 + w) if gemma else w)


def _inv_freq(theta: float, dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def llama3_inv_freq(theta: float, dim: int, s: dict[str, Any]) -> np.ndarray:
    """transformers' ``_compute_llama3_parameters``: long wavelengths divided by the factor,
    a smooth blend between."""
    inv = _inv_freq(theta, dim)
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return np.where(medium, smoothed, out)


def _rope(x: np.ndarray, inv_freq: np.ndarray, mscale: float = 1.0) -> np.ndarray:
    """Rotate-half rope (``apply_rotary_pos_emb``); x is (tokens, heads, head_dim); ``mscale``
    multiplies cos and sin (Phi-3's long-rope attention factor)."""
    pos = np.arange(x.shape[0], dtype=np.float64)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = mscale * np.cos(emb)[:, None, :], mscale * np.sin(emb)[:, None, :]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rot * sin).astype(np.float32)


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    softcap: float | None,
    window: int | None,
) -> np.ndarray:
    t, n_head, _ = q.shape
    rep = n_head // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        scores = np.tanh(scores / softcap) * softcap
    qi, ki = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = ki <= qi
    if window:
        allowed &= (qi - ki) < window
    scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v).reshape(t, -1)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _moe(
    family: str, cfg: dict[str, Any], w: dict[str, np.ndarray], p: str, m: np.ndarray
) -> np.ndarray:
    """Sparse experts: softmax router, top-k, weights renormalised (modeling_mixtral.py,
    modeling_qwen3_moe.py with norm_topk_prob), each chosen expert a SwiGLU."""
    if family == "mixtral":
        router, k = w[p + "block_sparse_moe.gate.weight"], cfg["num_experts_per_tok"]
        names = [
            (
                f"{p}block_sparse_moe.experts.{e}.w1.weight",
                f"{p}block_sparse_moe.experts.{e}.w3.weight",
                f"{p}block_sparse_moe.experts.{e}.w2.weight",
            )
            for e in range(len(router))
        ]
    else:
        router, k = w[p + "mlp.gate.weight"], cfg["num_experts_per_tok"]
        names = [
            (
                f"{p}mlp.experts.{e}.gate_proj.weight",
                f"{p}mlp.experts.{e}.up_proj.weight",
                f"{p}mlp.experts.{e}.down_proj.weight",
            )
            for e in range(len(router))
        ]
    logits = m @ router.T
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.zeros_like(m)
    for t in range(m.shape[0]):
        top = np.argsort(-probs[t])[:k]
        weights = probs[t, top] / probs[t, top].sum()
        for e, wt in zip(top, weights, strict=True):
            g, u, dn = names[e]
            out[t] += wt * ((_silu(m[t] @ w[g].T) * (m[t] @ w[u].T)) @ w[dn].T)
    return out


def forward(
    family: str, cfg: dict[str, Any], w: dict[str, np.ndarray], ids: list[int]
) -> np.ndarray:
    """Logits (tokens, vocab) of the checkpoint for the token ids, in float32."""
    gemma = family.startswith("gemma")
    h, n_head, n_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // n_head
    eps = cfg["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][ids].astype(np.float32)
    if gemma:
        x = x * np.float32(math.sqrt(h))
    theta = cfg["rope_theta"]
    if family == "llama31":
        inv_global = llama3_inv_freq(theta, hd, cfg["rope_scaling"])
    else:
        inv_global = _inv_freq(theta, hd)
    inv_local = _inv_freq(cfg.get("rope_local_base_freq", theta), hd)
    mscale = 1.0
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("type") == "longrope":
        # modeling_phi3 / _compute_longrope_parameters: short factors within the original
        # context (the prompts here), the attention factor from the context extension.
        orig = cfg["original_max_position_embeddings"]
        inv_global = inv_global / np.asarray(scaling["short_factor"], dtype=np.float64)
        factor = cfg["max_position_embeddings"] / orig
        mscale = math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1 else 1.0
    scale = (cfg.get("query_pre_attn_scalar") or hd) ** -0.5
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t = len(ids)
        if family == "gemma2":
            sliding = i % 2 == 0
        elif family == "gemma3":
            sliding = (i + 1) % cfg["sliding_window_pattern"] != 0
        else:
            sliding = False
        window = cfg.get("sliding_window") if (sliding or family in ("mistral",)) else None
        a = _rms(x, w[p + "input_layernorm.weight"], eps, gemma)
        if family == "phi3":
            qkv = a @ w[p + "self_attn.qkv_proj.weight"].T
            q, k, v = np.split(qkv, [n_head * hd, n_head * hd + n_kv * hd], axis=-1)
        else:
            q = a @ w[p + "self_attn.q_proj.weight"].T
            k = a @ w[p + "self_attn.k_proj.weight"].T
            v = a @ w[p + "self_attn.v_proj.weight"].T
            if p + "self_attn.q_proj.bias" in w:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
        q, k, v = q.reshape(t, n_head, hd), k.reshape(t, n_kv, hd), v.reshape(t, n_kv, hd)
        if p + "self_attn.q_norm.weight" in w:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps, gemma)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps, gemma)
        inv = inv_local if (family == "gemma3" and sliding) else inv_global
        q, k = _rope(q, inv, mscale), _rope(k, inv, mscale)
        attn = _attend(q, k, v, scale, cfg.get("attn_logit_softcapping"), window)
        o = attn @ w[p + "self_attn.o_proj.weight"].T
        if gemma:
            o = _rms(o, w[p + "post_attention_layernorm.weight"], eps, gemma)
            x = x + o
            m = _rms(x, w[p + "pre_feedforward_layernorm.weight"], eps, gemma)
        else:
            x = x + o
            m = _rms(x, w[p + "post_attention_layernorm.weight"], eps, gemma)
        if family in ("mixtral", "qwen3moe"):
            d = _moe(family, cfg, w, p, m)
        else:
            if family == "phi3":
                gate, up = np.split(m @ w[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
            else:
                gate = m @ w[p + "mlp.gate_proj.weight"].T
                up = m @ w[p + "mlp.up_proj.weight"].T
            act = _gelu_tanh(gate) if gemma else _silu(gate)
            d = (act * up) @ w[p + "mlp.down_proj.weight"].T
        if gemma:
            d = _rms(d, w[p + "post_feedforward_layernorm.weight"], eps, gemma)
        x = x + d
    x = _rms(x, w["model.norm.weight"], eps, gemma)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = x @ head.T
    if cfg.get("final_logit_softcapping"):
        cap = cfg["final_logit_softcapping"]
        logits = np.tanh(logits / cap) * cap
    return logits.astype(np.float32)
