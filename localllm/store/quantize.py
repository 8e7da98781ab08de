"""Quantization with llama.cpp's ``llama_model_quantize``, in a child process.

The child (``python -m localllm.store.quantize``) loads llama.cpp, routes its log through
``llama_log_set`` and reports each finished tensor as a JSON line on a pipe; the parent turns
them into progress events in bytes (``quantizing F16 model to Q4_K_M``, total/completed, as
Ollama's ``/api/create`` streams). A crash of llama.cpp (a bad file, a bug, memory) kills only the
child: the caller gets :class:`QuantizeError`, the daemon lives on. Cancelling kills the child.

Targets: q4_0, q4_K_S, q4_K_M (alias q4_K), q5_K_M, q6_K, q8_0, f16, f32 (case-insensitive).
The source must be F32, F16 or BF16 unless ``allow_requantize`` is set, as in Ollama.

This module and the runner are the only places that touch llama.cpp.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import DiskFullError, QuantizeError
from .._format import REBUILD_FOR_THIS_CPU, exit_status, human_size
from .._process import child_events, spawn_reporting

# The child process runs this very module (python -m localllm.store.quantize): what only the parent
# needs (numpy, gguf, httpx through localllm.sources) is imported inside the parent's functions,
# so every quantization does not pay for it twice.
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..sources.progress import ProgressCallback
    from .manifest import Layer
    from .store import Store

__all__ = [
    "QUANTIZABLE_SOURCE_TYPES",
    "QUANT_TYPES",
    "REQUANTIZE_MESSAGE",
    "Quantize",
    "check_quantizable",
    "estimate_quantized_size",
    "normalize_quant",
    "quantize_file",
    "quantize_into_store",
]

# Target name → llama_ftype (llama.h). Bits per weight are for the disk-space estimate.
QUANT_TYPES: dict[str, int] = {
    "Q4_0": 2,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "Q8_0": 7,
    "F16": 1,
    "F32": 0,
}
_BITS_PER_WEIGHT = {
    "Q4_0": 4.5,
    "Q4_K_S": 4.6,
    "Q4_K_M": 4.9,
    "Q5_K_M": 5.7,
    "Q6_K": 6.6,
    "Q8_0": 8.5,
    "F16": 16.0,
    "F32": 32.0,
}
_ALIASES = {"Q4_K": "Q4_K_M"}
QUANTIZABLE_SOURCE_TYPES = ("F32", "F16", "BF16")
REQUANTIZE_MESSAGE = "quantization is only supported for F16, BF16 and F32 models"
# ggml_log_level: an ERROR line is kept for the error message.
_LOG_LEVEL_ERROR = 4
_LOG_LEVEL_CONT = 5
_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_POLL = 0.2


def normalize_quant(quant: str) -> str:
    """Canonical name of a target (``q4_k`` → ``Q4_K_M``); raises :class:`QuantizeError`."""
    key = quant.strip().upper()
    key = _ALIASES.get(key, key)
    if key not in QUANT_TYPES:
        raise QuantizeError(
            f"unsupported quantization type {quant!r}; use one of q4_0, q4_K_S, q4_K_M (q4_K), "
            "q5_K_M, q6_K, q8_0, f16, f32"
        )
    return key


def estimate_quantized_size(parameters: int, quant: str) -> int:
    """Bytes of a model of ``parameters`` weights quantized to ``quant`` (an estimate from
    the type's bits per weight: what a disk check or the Hub's listing needs before any file
    exists)."""
    return int(parameters * _BITS_PER_WEIGHT[normalize_quant(quant)] / 8)


def check_quantizable(file_type: str | None, what: str, *, allow_requantize: bool = False) -> None:
    """Refuse (Ollama's message) to quantize a model that is already quantized.

    ``file_type`` ``None`` (unknown) passes; the file is checked again once it is local.
    """
    if allow_requantize or file_type is None or file_type.upper() in QUANTIZABLE_SOURCE_TYPES:
        return
    raise QuantizeError(
        f"{REQUANTIZE_MESSAGE} ({what} is {file_type}; --allow-requantize quantizes it anyway, "
        "at a loss of quality)"
    )


def _child_command(arguments: dict[str, Any]) -> list[str]:
    # A function of its own so tests can stand in a child that crashes.
    return [sys.executable, "-m", "localllm.store.quantize", json.dumps(arguments)]


def quantize_file(
    source: Path,
    output: Path,
    quant: str,
    *,
    allow_requantize: bool = False,
    threads: int = 0,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    disk_full: Callable[[Path], bool] | None = None,
    checkpoint: Callable[[str], None] | None = None,
) -> None:
    """Quantize the GGUF ``source`` (one file, or a split model's first part with the others
    beside it) into the new file ``output``, in a child process.

    Progress events (``quantizing F16 model to Q4_K_M``, total/completed in bytes of source
    tensors) go to ``on_progress`` on the calling thread. ``threads`` <= 0 lets llama.cpp use
    every core. Raises :class:`QuantizeError` (with llama.cpp's message, or the signal that
    killed the child), :class:`DiskFullError` when ``disk_full(output)`` says the disk filled
    up (llama.cpp's message does not say), or :class:`OperationCancelledError`; ``output`` is
    removed on failure. ``checkpoint`` is told ``quantize-started`` after the first tensor.
    """
    from ..gguf_info import inspect_gguf
    from ..sources.progress import PullProgress

    target = normalize_quant(quant)
    info = inspect_gguf(source)
    check_quantizable(info.file_type, source.name, allow_requantize=allow_requantize)
    sizes = {tensor.name: tensor.n_bytes for tensor in info.tensors}
    _add_split_tensors(source, info.metadata.get("split.count"), sizes)
    total = sum(sizes.values())
    status = f"quantizing {info.file_type} model to {target}"
    emit = on_progress or (lambda event: None)
    emit(PullProgress(status, total=total, completed=0))

    arguments = {
        "parent": os.getpid(),
        "source": str(source),
        "output": str(output),
        "ftype": QUANT_TYPES[target],
        "allow_requantize": allow_requantize,
        "threads": threads,
    }
    errors: list[str] = []
    done = 0
    result: int | None = None
    with tempfile.TemporaryFile() as child_output:
        process, read_fd = spawn_reporting(_child_command(arguments), child_output)
        try:
            for event in child_events(read_fd, cancel, "quantization cancelled", _POLL):
                if "tensor" in event:
                    if checkpoint is not None and not done:
                        checkpoint("quantize-started")
                    done += sizes.get(str(event.get("name")), 0)
                    emit(PullProgress(status, total=total, completed=min(done, total)))
                elif "error" in event:
                    errors.append(str(event["error"]))
                elif "result" in event:
                    result = int(event["result"])
            returncode = process.wait()
        except BaseException:
            process.kill()
            process.wait()
            output.unlink(missing_ok=True)
            raise
        finally:
            os.close(read_fd)
        if returncode != 0 or result != 0:
            full = disk_full is not None and returncode > 0 and disk_full(output)
            output.unlink(missing_ok=True)
            if full:
                error = DiskFullError(
                    f"the disk filled up while llama.cpp wrote the {target} model"
                )
                error.low_level = True  # type: ignore[attr-defined]  # the transaction says more
                raise error
            child_output.seek(0)
            tail = child_output.read()[-2000:].decode("utf-8", "replace").strip()
            raise QuantizeError(_failure_message(returncode, errors, tail, target))
    emit(PullProgress(status, total=total, completed=total))


def _add_split_tensors(first: Path, count: Any, sizes: dict[str, int]) -> None:
    from ..gguf_info import inspect_gguf

    # The other parts of a split model sit beside the first (see sources.splits).
    if not isinstance(count, int) or count <= 1:
        return
    match = re.match(r"^(.*)-00001-of-(\d{5})\.gguf$", first.name)
    if not match:
        return
    for index in range(2, count + 1):
        part = first.with_name(f"{match.group(1)}-{index:05d}-of-{match.group(2)}.gguf")
        sizes.update({t.name: t.n_bytes for t in inspect_gguf(part).tensors})


def _failure_message(returncode: int, errors: list[str], tail: str, target: str) -> str:
    if returncode < 0:
        import signal

        how = exit_status(returncode).removeprefix("was killed by ")
        message = f"llama.cpp crashed ({how}) while quantizing to {target}; the source is unchanged"
        if -returncode == signal.SIGILL:
            message += (
                f"; its native code used an instruction this CPU cannot run: {REBUILD_FOR_THIS_CPU}"
            )
        return message
    reason = "; ".join(e for e in errors if e) or (tail.splitlines()[-1] if tail else "")
    reason = reason.removeprefix("llama_model_quantize: ").strip()
    return f"quantizing to {target} failed: {reason or f'exit status {returncode}'}"


@dataclass(frozen=True)
class Quantize:
    """How to quantize the weights of a model being created (:func:`quantize_into_store`)."""

    target: str
    """The quantization type (``q8_0``, ``Q4_K_M``...)."""
    allow_requantize: bool = False
    """Quantize a source that is already quantized (at a loss of quality)."""
    threads: int = 0
    """llama.cpp's threads; 0 for every core."""
    on_progress: ProgressCallback | None = None
    """Receives the quantizer's progress events."""
    cancel: threading.Event | None = None
    """Set to stop the quantizer."""


def quantize_into_store(store: Store, paths: list[Path], quantize: Quantize, what: str) -> Layer:
    """Quantize the GGUF at ``paths`` (a split model's parts in order) into a new blob of
    ``store`` and return its model layer; call inside a :meth:`Store.transaction`.

    Refuses before starting when the disk cannot hold the result (an estimate from the
    weight count); a disk that fills up meanwhile is a :class:`DiskFullError` too. llama.cpp
    writes into ``partial/``; the file becomes a blob only once complete and of the right type.
    """
    from ..gguf_info import inspect_gguf
    from ..sources.blobfile import hash_file
    from ..sources.splits import linked_splits
    from .manifest import MEDIA_MODEL, Layer

    target = normalize_quant(quantize.target)
    info = inspect_gguf(paths[0])
    check_quantizable(info.file_type, what, allow_requantize=quantize.allow_requantize)
    weights = sum(inspect_gguf(path).parameter_count for path in paths)
    estimate = estimate_quantized_size(weights, target)
    free = store.free_space()
    if estimate > free:
        raise DiskFullError(
            f"not enough disk space to quantize {what} to {target}: about "
            f"{human_size(estimate)} needed, {human_size(free)} free"
        )

    def filled_up(output: Path) -> bool:
        try:
            written = output.stat().st_size
        except OSError:
            written = 0
        return written + store.free_space() < estimate

    with store.writing():
        output = store.temp_path().with_suffix(".gguf")
        store.checkpoint("quantize-ready")
        try:
            with linked_splits(paths) as first:
                quantize_file(
                    first,
                    output,
                    target,
                    allow_requantize=quantize.allow_requantize,
                    threads=quantize.threads,
                    on_progress=quantize.on_progress,
                    cancel=quantize.cancel,
                    disk_full=filled_up,
                    checkpoint=store.checkpoint,
                )
            store.checkpoint("quantize-written")
            produced = inspect_gguf(output).file_type
            if produced != target:
                raise QuantizeError(f"llama.cpp wrote a {produced} model, not {target}")
            digest = hash_file(output)
            size = output.stat().st_size
            store.publish(output, digest)
        finally:
            output.unlink(missing_ok=True)
    return Layer(MEDIA_MODEL, digest, size)


# -- the child process -------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """End this child when the process that started it dies (a killed daemon must not leave
    a quantizer writing into its store behind it). Linux's PR_SET_PDEATHSIG; elsewhere the
    child ends when it finds its event pipe closed."""
    import ctypes
    import ctypes.util
    import signal

    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if parent and os.getppid() != parent:
        os._exit(1)  # the parent died before the line above took effect


def _child_main(argv: list[str]) -> int:
    """Run one quantization; report tensors and errors as JSON lines on the given fd."""
    import ctypes

    arguments = json.loads(argv[0])
    _die_with_parent(int(arguments.get("parent", 0)))
    events = os.fdopen(int(argv[1]), "w", buffering=1)

    def send(event: dict[str, Any]) -> None:
        events.write(json.dumps(event) + "\n")

    import llama_cpp

    pending: list[str] = []
    line_level = [0]

    def on_log(level: int, text: bytes | None, _user_data: Any) -> None:
        piece = text.decode("utf-8", "replace") if text else ""
        if not pending and level != _LOG_LEVEL_CONT:
            line_level[0] = level
        pending.append(piece)
        if "\n" not in piece:
            return
        *lines, rest = "".join(pending).split("\n")
        pending[:] = [rest] if rest else []
        for line in lines:
            match = _TENSOR_LINE.match(line)
            if match:
                send(
                    {
                        "tensor": int(match.group(1)),
                        "of": int(match.group(2)),
                        "name": match.group(3),
                    }
                )
            elif line_level[0] == _LOG_LEVEL_ERROR and line.strip():
                send({"error": line.strip()})

    callback = llama_cpp.llama_log_callback(on_log)  # referenced until exit: C keeps the pointer
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(arguments["ftype"])
    params.nthread = int(arguments["threads"])
    params.allow_requantize = bool(arguments["allow_requantize"])
    result = llama_cpp.llama_model_quantize(
        arguments["source"].encode(), arguments["output"].encode(), ctypes.byref(params)
    )
    send({"result": int(result)})
    events.close()
    return 0 if result == 0 else 1


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
