"""Images in prompts, through llama.cpp's mtmd (the multimodal library) and a vision projector.

The projector GGUF (``mmproj``) turns an image into embeddings the text model reads like token
embeddings. Prompt preparation (worker threads) decodes the image files, tokenizes the prompt
with mtmd (text pieces become tokens, each :data:`~.protocol.IMAGE_MARKER` becomes an image
chunk) and encodes every image into its embeddings (recent ones are kept, so a conversation's
images are encoded once); the engine thread later only decodes those embeddings into the
slot's sequence (:meth:`.model.LlamaModel.decode_embeddings`).

For the engine an image is a run of pseudo-token ids in the prompt, one per embedding: negative
numbers (never a vocabulary id) derived from the image file's SHA-256, the chunk's place in the
prompt and the position in the image.
Prefix matching, prefix sharing between slots and the saved-prefix tiers compare token lists, so
they reuse an image's KV cells exactly when the same image sits at the same place after the
same tokens, and never for another image.

This module is the only one of the runner that calls mtmd.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

import llama_cpp
from llama_cpp import mtmd_cpp as mtmd

from ..runner.protocol import IMAGE_MARKER
from .model import _FLASH, LlamaModel, ModelLoadError, set_fields

__all__ = [
    "ImageEmbeddings",
    "VisionError",
    "VisionProjector",
    "VisionPrompt",
    "is_image_token",
    "route_mtmd_log",
]

log = logging.getLogger("localllm.runner.vision")

# File signatures of the formats we accept (stb_image reads them). Anything else is refused
# before mtmd sees it: mtmd's helper would otherwise try it as audio, then as a video by
# launching ffprobe on the bytes.
_SIGNATURES = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",  # JPEG
    b"GIF87a",
    b"GIF89a",
    b"BM",  # BMP
)
# Where mtmd's helper would look for ffmpeg/ffprobe if a file with an image signature fails
# to decode as an image: a folder that does not exist, so it never runs a program.
_NO_FFMPEG = b"/nonexistent/localllm-no-ffmpeg"
# Pseudo-token ids: -2 .. -2**31 (-1 stays free: llama.cpp uses it as "no token").
_PSEUDO_RANGE = (1 << 31) - 2
_LOG_ERROR = 4  # ggml_log_level
# Host RAM for recently encoded images: a 576-embedding LLaVA image of a 4096-wide model is
# 9 MiB, so this keeps a conversation's images without encoding them again every turn.
_ENCODED_CACHE_BYTES = 256 << 20


def is_image_token(token: int) -> bool:
    """Whether ``token`` is an image pseudo-token (one embedding of an image)."""
    return token < 0


def _pseudo_tokens(digest: bytes, count: int) -> list[int]:
    base = int.from_bytes(digest[:8], "little")
    return [-2 - (base + i) % _PSEUDO_RANGE for i in range(count)]


class VisionError(ValueError):
    """An image request that cannot be prepared; ``code`` is the protocol error code."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ImageEmbeddings:
    """One image of a prompt, encoded: what the engine decodes into the sequence."""

    n_tokens: int
    """Embeddings (and KV cells, and prompt positions) the image takes."""
    data: Any
    """``n_tokens x n_embd`` floats (a ctypes array); None once decoded."""
    non_causal: bool = False
    """The model attends to the image's embeddings both ways (Gemma 3): one decode for all."""


@dataclass
class VisionPrompt:
    """A prompt with images: tokens (images as pseudo-tokens) and the images by position."""

    tokens: list[int]
    """Prompt tokens; each image is ``n_tokens`` pseudo-tokens."""
    images: dict[int, ImageEmbeddings]
    """Image at each prompt position where one starts."""


# mtmd's latest error line: why a projector failed to load, for the one-line load error.
_last_error = [""]


def route_mtmd_log() -> None:
    """Send mtmd's log where llama.cpp's goes (call after :func:`.model.route_llama_log`),
    remembering its latest error line."""
    from .model import _log_state

    forward = _log_state.get("callback")

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if level == _LOG_ERROR:
            _last_error[0] = text.decode("utf-8", errors="replace").strip()
        if forward is not None:
            forward(level, text, user_data)  # type: ignore[operator]

    _log_state["mtmd_callback"] = callback  # referenced for as long as mtmd may call it
    mtmd.mtmd_helper_log_set(callback, ctypes.c_void_p(0))


def _load_error(path: str) -> str:
    reason = _last_error[0].split("error: ", 1)[-1].strip()
    return f"llama.cpp could not load the vision projector {path}" + (
        f": {reason}" if reason else " (see the log above)"
    )


class VisionProjector:
    """A loaded vision projector for a :class:`LlamaModel`.

    mtmd's context is not safe to use from several threads at once; prompt preparation runs in
    worker threads, so every call holds a lock.
    """

    def __init__(self, path: str, model: LlamaModel) -> None:
        params = mtmd.mtmd_context_params_default()
        set_fields(
            params,
            use_gpu=model.n_gpu_layers > 0,
            print_timings=False,
            n_threads=model.n_threads,
            warmup=False,  # an encode of a dummy image at load: time for nothing
            flash_attn_type=_FLASH[model.config.flash_attention],
            media_marker=IMAGE_MARKER.encode(),
        )
        self._marker = params.media_marker  # the struct keeps a pointer to these bytes
        self.path = path
        _last_error[0] = ""
        self.ctx = mtmd.mtmd_init_from_file(path.encode(), model.model, params)
        if not self.ctx:
            raise ModelLoadError(_load_error(path))
        if not mtmd.mtmd_support_vision(self.ctx):
            self.close()
            raise ModelLoadError(f"the projector {path} has no vision encoder")
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model.model))
        """Floats per embedding (the text model's input embedding size)."""
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(self.ctx))
        """The model places image embeddings in 2-D (M-RoPE, Qwen2-VL style)."""
        self.n_batch = model.n_batch
        self._lock = threading.Lock()
        self._encoded: collections.OrderedDict[tuple[bytes, int], Any] = collections.OrderedDict()
        """Recently encoded images' embeddings, least recently used first."""
        self._encoded_bytes = 0

    def prepare(self, text: str, images: list[bytes], add_special: bool) -> VisionPrompt:
        """Tokenize ``text`` with ``images`` at its markers and encode the images.

        Raises :class:`VisionError`: ``bad_request`` for a marker count that does not match the
        images or an image that cannot be decoded (naming it, counting from 1),
        ``unsupported`` for what this runner cannot place in a sequence.
        """
        markers = text.count(IMAGE_MARKER)
        if markers != len(images):
            raise VisionError(
                f"the prompt has {markers} image marker{'s' if markers != 1 else ''} "
                f"({IMAGE_MARKER}) but {len(images)} image{'s' if len(images) != 1 else ''} "
                "came with it: each image needs its marker"
            )
        if self.mrope:
            raise VisionError(
                "this model places image embeddings with M-RoPE (Qwen2-VL style), which this "
                "runner does not support yet",
                "unsupported",
            )
        with self._lock:
            bitmaps: list[Any] = []
            chunks = None
            try:
                for index, data in enumerate(images, start=1):
                    bitmaps.append(self._bitmap(index, data))
                chunks = mtmd.mtmd_input_chunks_init()
                if not chunks:
                    raise MemoryError("mtmd could not allocate input chunks")
                encoded = text.encode("utf-8")
                text_input = mtmd.mtmd_input_text()
                text_input.text = encoded
                text_input.text_len = len(encoded)
                text_input.add_special = add_special
                text_input.parse_special = True
                array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
                status = mtmd.mtmd_tokenize(
                    self.ctx, chunks, ctypes.byref(text_input), array, len(bitmaps)
                )
                if status != 0:
                    raise VisionError(f"mtmd could not tokenize the prompt (status {status})")
                return self._walk(chunks)
            finally:
                if chunks:
                    mtmd.mtmd_input_chunks_free(chunks)
                for bitmap in bitmaps:
                    mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, index: int, data: bytes) -> Any:
        if not data.startswith(_SIGNATURES):
            raise VisionError(
                f"image {index} could not be decoded: it is not a PNG, JPEG, GIF or BMP file"
            )
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        options = mtmd.mtmd_helper_init_opt_default()
        options.video_params.ffmpeg_bin_dir = _NO_FFMPEG
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buffer, len(data), False, options)
        if not bitmap:
            raise VisionError(f"image {index} could not be decoded")
        if mtmd.mtmd_bitmap_is_audio(bitmap):
            mtmd.mtmd_bitmap_free(bitmap)
            raise VisionError(f"image {index} could not be decoded")
        return bitmap

    def _walk(self, chunks: Any) -> VisionPrompt:
        tokens: list[int] = []
        images: dict[int, ImageEmbeddings] = {}
        image_index = 0
        seen: dict[bytes, int] = {}
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t(0)
                pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                tokens.extend(pointer[: count.value] if count.value else [])
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise VisionError("only images are supported, not audio", "unsupported")
            image_index += 1
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            if n_pos != n_tokens:
                raise VisionError(
                    f"image {image_index} takes {n_pos} positions for {n_tokens} embeddings "
                    "(M-RoPE), which this runner does not support yet",
                    "unsupported",
                )
            non_causal = bool(mtmd.mtmd_decode_use_non_causal(self.ctx, chunk))
            if non_causal and n_tokens > self.n_batch:
                raise VisionError(
                    f"image {image_index} is {n_tokens} embeddings, which this model must read "
                    f"in one batch, but the batch holds {self.n_batch}: raise num_batch",
                    "unsupported",
                )
            # The chunk's id is the SHA-256 of its image file; a model that cuts one image
            # into several chunks (slices) tells them apart by their order.
            name = mtmd.mtmd_input_chunk_get_id(chunk) or b""
            seen[name] = seen.get(name, -1) + 1
            key = (name, seen[name]) if name else None
            data = self._encode(image_index, chunk, n_tokens, key)
            images[len(tokens)] = ImageEmbeddings(n_tokens, data, non_causal)
            digest = hashlib.sha256(name + b":%d" % i).digest()
            tokens.extend(_pseudo_tokens(digest, n_tokens))
        return VisionPrompt(tokens, images)

    def _encode(
        self, image_index: int, chunk: Any, n_tokens: int, key: tuple[bytes, int] | None
    ) -> Any:
        """The embeddings of an image chunk: encoded now, or kept from an earlier request (a
        conversation sends its images again with every turn)."""
        cached = self._encoded.get(key) if key is not None else None
        if cached is not None:
            self._encoded.move_to_end(key)  # type: ignore[arg-type]
            return cached
        if mtmd.mtmd_encode_chunk(self.ctx, chunk) != 0:
            raise VisionError(f"image {image_index} could not be encoded", "internal")
        count_floats = n_tokens * self.n_embd
        output = mtmd.mtmd_get_output_embd(self.ctx)
        data = (ctypes.c_float * count_floats)()
        ctypes.memmove(data, output, count_floats * ctypes.sizeof(ctypes.c_float))
        if key is not None:
            self._encoded[key] = data
            self._encoded_bytes += ctypes.sizeof(data)
            while self._encoded_bytes > _ENCODED_CACHE_BYTES and len(self._encoded) > 1:
                _, dropped = self._encoded.popitem(last=False)
                self._encoded_bytes -= ctypes.sizeof(dropped)
        return data

    def close(self) -> None:
        """Free the mtmd context."""
        if self.ctx:
            mtmd.mtmd_free(self.ctx)
            self.ctx = None
