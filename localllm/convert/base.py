"""What every model family shares: reading config.json, the tensor plan, the GGUF metadata.

A family module (``llama.py``, ``qwen2.py``, ...) subclasses :class:`Family` and says only what
differs: its GGUF architecture, the tensors a layer holds and their shapes, and the few tensor
fixes its checkpoints need (Llama's q/k row order, Gemma's norm offset). HF tensor names become
GGUF names through llama.cpp's own tables (``gguf.get_tensor_name_map``), so a name this module
maps is the name llama.cpp looks up when it loads the file.

Every tensor is checked against the shape the config implies before anything is written: a
checkpoint whose weights disagree with its config is refused by name instead of producing a GGUF
that llama.cpp rejects (or worse, loads).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gguf
import numpy as np

from localllm._exceptions import ConvertError, MissingConfigError, TensorMismatchError
from localllm.convert.shards import TensorEntry

__all__ = ["Family", "OutTensor", "llama_rope_permutation"]

# Tensors some checkpoints carry that llama.cpp recomputes itself.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.attn\.masked_bias|\.attn\.bias)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


@dataclass
class OutTensor:
    """One tensor of the GGUF to write: its name, shape, and where its values come from."""

    name: str
    shape: tuple[int, ...]
    """In numpy order (rows first), as the source stores it."""
    source: TensorEntry | None = None
    more: list[TensorEntry] = field(default_factory=list)
    """Further sources stacked after ``source`` on a new first axis (MoE experts)."""
    data: np.ndarray | None = None
    """Values computed by the converter (e.g. Llama 3.1's rope factors) when no source."""
    order: np.ndarray | None = None
    """A permutation of the rows to apply while reading (Llama's q/k)."""
    offset: float = 0.0
    """Added to every value (Gemma's norm weights are stored as ``w`` for ``1 + w``)."""

    @property
    def source_bytes(self) -> int:
        """The bytes read from the checkpoint for this tensor (progress is counted in them)."""
        return self.source.nbytes + sum(e.nbytes for e in self.more) if self.source else 0

    @property
    def sources(self) -> list[TensorEntry]:
        """Every source, in writing order."""
        return [self.source, *self.more] if self.source is not None else []


def llama_rope_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row order turning HF's rotate-half q/k layout into llama.cpp's interleaved pairs.

    HF keeps each head's rows as [first halves..., second halves...]; llama.cpp's LLAMA rope
    rotates adjacent pairs, so row ``i`` of a head's first half must sit next to row ``i`` of
    its second half.
    """
    head = rows // n_head
    idx = np.arange(rows).reshape(n_head, 2, head // 2).swapaxes(1, 2).reshape(rows)
    return idx


class Family:
    """The conversion rules of one model family (a subclass per family, as Ollama's convert/).

    Subclasses set :attr:`name`, :attr:`architectures` and :attr:`gguf_arch`, and extend
    :meth:`layer_shapes`, :meth:`write_hparams` or :meth:`fix` where they differ from Llama's.
    """

    name: ClassVar[str] = ""
    architectures: ClassVar[tuple[str, ...]] = ()
    gguf_arch: ClassVar[gguf.MODEL_ARCH]
    norm_offset: ClassVar[float] = 0.0
    """Added to every ``*norm.weight`` (Gemma stores the norm as ``1 + w``)."""
    prefer_sentencepiece: ClassVar[bool] = True
    """Read tokenizer.model before tokenizer.json when both are there (as llama.cpp does)."""
    permute_qk: ClassVar[bool] = False
    """Llama's rope in llama.cpp pairs adjacent rows: q/k rows are reordered (HF → GGUF)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.notes: list[str] = []
        """What the family decided for the user, reported with the result."""
        c = self.config
        try:
            self.hidden = int(c["hidden_size"])
            self.n_layers = int(c["num_hidden_layers"])
            self.n_head = int(c["num_attention_heads"])
            self.n_kv = int(c.get("num_key_value_heads") or self.n_head)
            self.ffn = int(c["intermediate_size"])
            self.vocab = int(c["vocab_size"])
            self.head_dim = int(c.get("head_dim") or self.hidden // self.n_head)
            self.context_length = int(c.get("max_position_embeddings") or 0) or None
            self.eps = float(c.get("rms_norm_eps") or 1e-6)
            self.rope_theta = float(c.get("rope_theta") or 10000.0)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise MissingConfigError(f"config.json lacks a usable {exc} for {self.name}") from None
        if (
            min(
                self.hidden,
                self.n_layers,
                self.n_head,
                self.n_kv,
                self.ffn,
                self.vocab,
                self.head_dim,
            )
            <= 0
            or self.n_head % self.n_kv
        ):
            raise MissingConfigError(
                f"config.json's sizes cannot describe a {self.name} model "
                "(zero or negative, or heads not a multiple of kv heads)"
            )
        self.tied = bool(c.get("tie_word_embeddings", False))

    # ---- the tensors -------------------------------------------------------------------------

    def global_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the tensors outside the layers, by HF name (``lm_head`` when untied)."""
        shapes = {
            "model.embed_tokens.weight": (self.vocab, self.hidden),
            "model.norm.weight": (self.hidden,),
        }
        if not self.tied:
            shapes["lm_head.weight"] = (self.vocab, self.hidden)
        return shapes

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of one layer's required tensors, by name after ``model.layers.N.``."""
        q, kv = self.n_head * self.head_dim, self.n_kv * self.head_dim
        return {
            "input_layernorm.weight": (self.hidden,),
            "self_attn.q_proj.weight": (q, self.hidden),
            "self_attn.k_proj.weight": (kv, self.hidden),
            "self_attn.v_proj.weight": (kv, self.hidden),
            "self_attn.o_proj.weight": (self.hidden, q),
            "post_attention_layernorm.weight": (self.hidden,),
            "mlp.gate_proj.weight": (self.ffn, self.hidden),
            "mlp.up_proj.weight": (self.ffn, self.hidden),
            "mlp.down_proj.weight": (self.hidden, self.ffn),
        }

    def optional_layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensors a layer may hold or not (biases some checkpoints add)."""
        q, kv = self.n_head * self.head_dim, self.n_kv * self.head_dim
        return {
            "self_attn.q_proj.bias": (q,),
            "self_attn.k_proj.bias": (kv,),
            "self_attn.v_proj.bias": (kv,),
        }

    def fix(self, hf_name: str, out: OutTensor) -> None:
        """Adjust one tensor on its way to GGUF (row order, offsets); Llama's q/k here."""
        if self.permute_qk:
            if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
                out.order = llama_rope_permutation(out.shape[0], self.n_head)
            elif hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
                out.order = llama_rope_permutation(out.shape[0], self.n_kv)
        if self.norm_offset and hf_name.endswith("norm.weight"):
            out.offset = self.norm_offset

    def extra_tensors(self) -> list[OutTensor]:
        """Tensors llama.cpp wants that the checkpoint does not hold (none by default)."""
        return []

    def rename(self, hf_name: str) -> str | None:
        """The name a tensor is planned under (``None``: not converted); unchanged by default."""
        return hf_name

    def check_vocab(self, tokens: list[str]) -> None:
        """Refuse a vocabulary llama.cpp cannot load for this family (any, by default)."""

    def _expected(self, hf_name: str) -> tuple[tuple[int, ...] | None, bool]:
        """(shape, required) of a tensor by HF name; (None, False) for one not in the tables."""
        glob = self.global_shapes()
        if hf_name in glob:
            return glob[hf_name], True
        if hf_name == "lm_head.weight":
            return (self.vocab, self.hidden), False
        m = _LAYER.match(hf_name)
        if m is None or int(m.group(1)) >= self.n_layers:
            return None, False
        rest = m.group(2)
        req, opt = self.layer_shapes(), self.optional_layer_shapes()
        if rest in req:
            return req[rest], True
        return opt.get(rest), False

    def plan(self, tensors: Mapping[str, TensorEntry], config_dtype: str | None) -> list[OutTensor]:
        """The GGUF's tensors in writing order, each checked against the config."""
        renamed: dict[str, TensorEntry] = {}
        for name, entry in tensors.items():
            if (new := self.rename(name)) is not None:
                renamed[new] = entry
        tensors = renamed
        tmap = gguf.get_tensor_name_map(self.gguf_arch, self.n_layers)
        wanted = set(self.global_shapes())
        for i in range(self.n_layers):
            wanted.update(f"model.layers.{i}.{k}" for k in self.layer_shapes())
        missing = sorted(wanted - set(tensors), key=_natural)
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise TensorMismatchError(
                f"the checkpoint lacks {', '.join(missing[:3])}{more}, which config.json "
                f"({self.config.get('architectures', ['?'])[0]}, {self.n_layers} layers) implies"
            )
        out: list[OutTensor] = []
        experts: dict[str, dict[int, TensorEntry]] = {}
        for hf_name in sorted(tensors, key=_natural):
            if _IGNORED.search(hf_name):
                continue
            entry = tensors[hf_name]
            expected, _required = self._expected(hf_name)
            expert = _EXPERT.search(hf_name)
            # llama.cpp stores a layer's experts as one tensor, named without the index.
            lookup = _EXPERT.sub(".experts.", hf_name) if expert else hf_name
            gguf_name = tmap.get_name(lookup, try_suffixes=(".weight", ".bias"))
            if gguf_name is None or (expected is None and _LAYER.match(hf_name)):
                raise TensorMismatchError(
                    f"tensor {hf_name!r} is not part of a {self.name} model as config.json "
                    "describes it (another architecture's checkpoint, or a wrong config?)"
                )
            if entry.dtype not in ("BF16", "F16", "F32", "F64"):
                raise TensorMismatchError(
                    f"tensor {hf_name!r} is stored as {entry.dtype} but config.json says "
                    f"{config_dtype or 'float weights'}: only float checkpoints can be converted "
                    "(quantized safetensors such as GPTQ/AWQ/FP8 are not supported)"
                )
            if expected is not None and tuple(entry.shape) != tuple(expected):
                raise TensorMismatchError(
                    f"tensor {hf_name!r} has shape {list(entry.shape)} but config.json implies "
                    f"{list(expected)}"
                )
            if hf_name == "lm_head.weight" and self.tied:
                continue  # tied: llama.cpp reuses token_embd, an output.weight would be unused
            if expert:
                experts.setdefault(gguf_name, {})[int(expert.group(1))] = entry
                continue
            item = OutTensor(name=gguf_name, shape=tuple(entry.shape), source=entry)
            self.fix(hf_name, item)
            out.append(item)
        for gguf_name, parts in experts.items():
            ordered = [parts[e] for e in sorted(parts)]
            out.append(
                OutTensor(
                    name=gguf_name,
                    shape=(len(ordered), *ordered[0].shape),
                    source=ordered[0],
                    more=ordered[1:],
                )
            )
        out.extend(self.extra_tensors())
        return out

    # ---- the metadata ------------------------------------------------------------------------

    def rope_parameters(self) -> dict[str, Any]:
        """``rope_scaling`` (or transformers 5's ``rope_parameters``) with the theta inside."""
        c = self.config
        params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
        params.setdefault("rope_theta", self.rope_theta)
        if c.get("original_max_position_embeddings"):
            params.setdefault(
                "original_max_position_embeddings", c["original_max_position_embeddings"]
            )
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params["type"]
        return params

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """The ``<arch>.*`` keys llama.cpp reads for this family."""
        if self.context_length:
            w.add_context_length(self.context_length)
        w.add_embedding_length(self.hidden)
        w.add_block_count(self.n_layers)
        w.add_feed_forward_length(self.ffn)
        w.add_head_count(self.n_head)
        w.add_head_count_kv(self.n_kv)
        w.add_layer_norm_rms_eps(self.eps)
        try:
            w.add_rope_freq_base(float(self.rope_parameters()["rope_theta"]))
        except (TypeError, ValueError):
            raise MissingConfigError("config.json's rope_theta is not a number") from None
        if self.head_dim != self.hidden // self.n_head:
            w.add_key_length(self.head_dim)
            w.add_value_length(self.head_dim)
        self.write_rope_scaling(w)

    extra_rope_types: ClassVar[tuple[str, ...]] = ()
    """Rope scaling types the family writes itself (Llama 3's factors, Phi-3's long rope)."""

    def write_rope_scaling(self, w: gguf.GGUFWriter) -> None:
        """Linear and YaRN scaling as keys; a type nobody handles is refused, never dropped."""
        p = self.rope_parameters()
        kind = str(p.get("rope_type") or "").lower()
        factor = p.get("factor")
        if kind not in ("", "default", "linear", "yarn", *self.extra_rope_types):
            raise ConvertError(
                f"rope scaling {kind!r} of this {self.name} checkpoint is not supported by the "
                "converter; converting without it would change the model's long-context output"
            )
        if kind == "linear" and factor:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(factor))
        elif kind == "yarn" and factor:
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(factor))
            if p.get("original_max_position_embeddings"):
                w.add_rope_scaling_orig_ctx_len(int(p["original_max_position_embeddings"]))


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key: embeddings first, layers in numeric order, then the rest."""
    m = _LAYER.match(name)
    if name.startswith("model.embed"):
        return (0, 0, name)
    if m:
        return (1, int(m.group(1)), m.group(2))
    return (2, 0, name)
