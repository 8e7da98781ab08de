"""Models as the Hub ships them (a safetensors checkout) into the store: converted to GGUF by
:mod:`localllm.convert` in a child process, then quantized as any GGUF, then a blob.

A model kept unquantized is converted to F16 (as Ollama stores it). One that is quantized next
is converted with the converter's ``auto`` type: a bf16 checkpoint's matrices stay BF16, copied
by the kernel at the disk's speed instead of rounded to F16 on the CPU, and llama.cpp's
quantizer reads the checkpoint's own values.

A checkout comes as a folder on this machine (``create --from ./folder``, a Modelfile's
``FROM ./folder``) or as uploaded blobs named by their file names (Ollama's ``/api/create``
with ``files``, a pull of a Hugging Face repository without GGUF files). Blobs are hard-linked
under their names into a work folder in ``partial/`` (held while :meth:`Store.writing`, so
nothing collects them meanwhile); the converted GGUF is written there too; only the finished model
file becomes a blob. A failure or a kill leaves no blob and no name behind.

The child (``python -m localllm.store.safetensors``) reports ``{"progress": [done, total]}``
lines on a pipe, turned into ``converting ...`` events with completed/total bytes, as the
quantizer's are; a cancelled create kills it; its error comes back as a
:class:`~localllm._exceptions.ConvertError` with the converter's own message.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .._exceptions import DiskFullError, LocalLLMError, StoreError
from .._format import exit_status, human_size
from .._process import child_events, spawn_reporting

# The child process runs this very module: what only the parent needs is imported inside the
# parent's functions.
if TYPE_CHECKING:
    from ..sources.progress import ProgressCallback
    from .manifest import Layer
    from .quantize import Quantize
    from .store import Store

__all__ = [
    "CHECKPOINT_FILE_SUFFIXES",
    "PICKLE_SUFFIXES",
    "Checkout",
    "check_file_names",
    "convert_into_store",
    "inspect_checkout",
    "is_checkout_files",
    "linked_checkout",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Pickled PyTorch checkpoints: never unpickled (the converter refuses them, saying why)."""
CHECKPOINT_FILE_SUFFIXES = (".safetensors", ".json", ".model", ".jinja", ".txt", ".tiktoken")
"""The files of a checkout a conversion reads (weights, config, tokenizer, chat template)."""
_POLL = 0.2


@dataclass(frozen=True)
class Checkout:
    """A safetensors checkout to convert: a folder, or blobs by file name (one of them)."""

    folder: Path | None = None
    """A folder on the daemon's machine."""
    files: Mapping[str, str] | None = None
    """File name (relative, ``/`` separated) → blob digest."""
    on_progress: ProgressCallback | None = field(default=None, compare=False)
    """Receives ``converting ...`` events."""
    cancel: threading.Event | None = field(default=None, compare=False)
    """Set to stop the conversion (the child is killed)."""

    @property
    def what(self) -> str:
        """For messages: the folder, or ``the uploaded checkout``."""
        return str(self.folder) if self.folder is not None else "the uploaded checkout"


def is_checkout_files(names: Iterator[str] | list[str]) -> bool:
    """True when file names (``/api/create``'s ``files``) are a Hugging Face checkout rather
    than GGUF files: a ``config.json`` or any safetensors shard."""
    listed = [PurePosixPath(n).name.lower() for n in names]
    return "config.json" in listed or any(n.endswith(".safetensors") for n in listed)


def check_file_names(names: list[str]) -> None:
    """Refuse a checkout file name that could leave its folder (absolute, ``..``, empty
    parts, a backslash); raises :class:`StoreError` naming it."""
    for name in names:
        path = PurePosixPath(name)
        if (
            not name
            or "\\" in name
            or "\0" in name
            or path.is_absolute()
            or any(part in ("", ".", "..") for part in name.split("/"))
        ):
            raise StoreError(f"file name {name!r} is not a plain relative path in the checkout")


def _link(source: Path, target: Path, hard: bool) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if hard:
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # a filesystem without hard links: a symbolic one, the blob held by writing()
    os.symlink(source, target)


@contextlib.contextmanager
def linked_checkout(
    store: Store, files: Mapping[str, str], where: Path | None = None
) -> Iterator[Path]:
    """A folder holding ``files``' blobs under their names, removed on exit: hard links in
    ``where`` (inside the store, for a conversion), else symbolic links in a temporary
    folder (for a look at the headers). Raises :class:`StoreError` for a missing blob or a
    bad name."""
    check_file_names(list(files))
    for name, digest in files.items():
        if not store.has_blob(digest):
            raise StoreError(f"blob {digest} ({name}) not found; upload it first (POST /api/blobs)")
    with contextlib.ExitStack() as stack:
        if where is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="localllm-")))
        else:
            folder = where
            folder.mkdir(parents=True)
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
        for name, digest in files.items():
            _link(store.blob_path(digest), folder / name, hard=where is not None)
        yield folder


def inspect_checkout(store: Store, checkout: Checkout) -> Any:
    """The converter's :class:`~localllm.convert.FolderInfo` of ``checkout`` (headers only):
    raises :class:`~localllm._exceptions.ConvertError` for what it cannot convert (not a
    folder, an unsupported architecture, a missing tokenizer or shard, pickles...)."""
    from ..convert import inspect_folder

    if checkout.folder is not None:
        return inspect_folder(checkout.folder)
    assert checkout.files is not None
    with linked_checkout(store, checkout.files) as folder:
        return inspect_folder(folder)


# -- the parent ---------------------------------------------------------------------------------


def _child_command(arguments: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "localllm.store.safetensors", json.dumps(arguments)]


def convert_file(
    folder: Path,
    output: Path,
    status: str,
    *,
    outtype: str = "f16",
    sha256: bool = False,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Convert the checkout ``folder`` into the GGUF ``output`` (matrices in ``outtype``, one
    of the converter's) in a child process; ``status`` events with completed/total bytes go
    to ``on_progress`` on this thread. With ``sha256`` the result's ``sha256`` is the file's
    digest, hashed by the converter as it wrote the file.

    Raises the converter's :class:`ConvertError` (its message), a :class:`ConvertError` for
    a child that died (with its signal), :class:`DiskFullError` or
    :class:`OperationCancelledError`; ``output`` is removed on failure."""
    from .._exceptions import ConvertError
    from ..sources.progress import PullProgress

    emit = on_progress or (lambda event: None)
    arguments = {
        "parent": os.getpid(),
        "folder": str(folder),
        "output": str(output),
        "outtype": outtype,
        "sha256": sha256,
    }
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    with tempfile.TemporaryFile() as child_output:
        process, read_fd = spawn_reporting(_child_command(arguments), child_output)
        try:
            for event in child_events(read_fd, cancel, "conversion cancelled", _POLL):
                if "progress" in event:
                    done, total = (int(x) for x in event["progress"])
                    emit(PullProgress(status, total=total, completed=min(done, total)))
                elif "error" in event:
                    error = event
                elif "result" in event:
                    result = dict(event["result"])
            returncode = process.wait()
        except BaseException:
            process.kill()
            process.wait()
            output.unlink(missing_ok=True)
            raise
        finally:
            os.close(read_fd)
        if returncode == 0 and result is not None:
            return result
        output.unlink(missing_ok=True)
        if error is not None:
            if error.get("kind") in ("disk full", "DiskFullError"):
                full = DiskFullError(f"the disk filled up while converting: {error['error']}")
                full.low_level = True  # type: ignore[attr-defined]  # the transaction says more
                raise full
            raise ConvertError(str(error["error"]))
        child_output.seek(0)
        tail = child_output.read()[-2000:].decode("utf-8", "replace").strip()
        last = tail.splitlines()[-1] if tail else ""
        how = exit_status(returncode) if returncode else "ended without a result"
        raise ConvertError(f"the converter {how}{f': {last}' if last else ''}")


def convert_into_store(store: Store, checkout: Checkout, quantize: Quantize | None) -> Layer:
    """Convert ``checkout`` to a GGUF in ``partial/`` (F16, or the checkpoint's own 16-bit
    type when ``quantize`` follows), quantize it when ``quantize`` says, and publish the
    result as a blob: its model layer. Call inside a :meth:`Store.transaction` (the caller
    writes the manifest once this returned).

    Refuses before starting when the disk cannot hold the 16-bit file and the quantized one."""
    from ..convert import auto_outtype
    from ..gguf_info import inspect_gguf
    from ..sources.blobfile import hash_file
    from .manifest import MEDIA_MODEL, Layer
    from .quantize import estimate_quantized_size, quantize_into_store

    info = inspect_checkout(store, checkout)
    parameters = int(getattr(info, "parameter_count", 0) or 0)
    needed = parameters * 2
    if quantize is not None:
        needed += estimate_quantized_size(parameters, quantize.target)
    free = store.free_space()
    if needed > free:
        raise DiskFullError(
            f"not enough disk space to convert {checkout.what}: about {human_size(needed)} "
            f"needed, {human_size(free)} free"
        )
    architecture = getattr(info, "architecture", "") or "the"
    # Kept: F16, as the store names it. Quantized next: the checkpoint's own type, copied.
    outtype = "f16" if quantize is None else auto_outtype(str(getattr(info, "dtype", "")))
    status = f"converting {architecture} safetensors to {outtype.upper()} GGUF"
    with store.writing():
        work = store.temp_path()
        try:
            if checkout.files is not None:
                folder_context: contextlib.AbstractContextManager[Path] = linked_checkout(
                    store, checkout.files, work / "checkout"
                )
            else:
                assert checkout.folder is not None
                work.mkdir(parents=True)
                folder_context = contextlib.nullcontext(checkout.folder)
            with folder_context as folder:
                output = work / f"model-{outtype}.gguf"
                result = convert_file(
                    folder,
                    output,
                    status,
                    outtype=outtype,
                    sha256=quantize is None,  # the file becomes the blob: hashed as written
                    on_progress=checkout.on_progress,
                    cancel=checkout.cancel,
                )
            if checkout.on_progress is not None:
                from ..sources.progress import PullProgress

                # What the converter decided (a pre-tokenizer found by its regex...): said.
                for note in result.get("notes") or []:
                    checkout.on_progress(PullProgress(f"converter: {note}"))
            store.checkpoint("convert-written")
            produced = inspect_gguf(output)
            produced.require_model()
            if quantize is not None:
                return quantize_into_store(store, [output], quantize, checkout.what)
            digest = str(result.get("sha256") or "") or hash_file(output)
            size = output.stat().st_size
            store.publish(output, digest)
            return Layer(MEDIA_MODEL, digest, size)
        except OSError as exc:
            raise store.write_error(exc, f"the conversion of {checkout.what}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)


# -- the child process -------------------------------------------------------------------------


def _child_main(argv: list[str]) -> int:
    """Run one conversion; report progress, an error or the result as JSON lines."""
    import errno
    import time

    arguments = json.loads(argv[0])
    from .quantize import _die_with_parent

    _die_with_parent(int(arguments.get("parent", 0)))
    events = os.fdopen(int(argv[1]), "w", buffering=1)

    def send(event: dict[str, Any]) -> None:
        events.write(json.dumps(event) + "\n")

    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.1 or done >= total:  # a line per tensor would flood the pipe
            last[0] = now
            send({"progress": [int(done), int(total)]})

    from ..convert import convert_folder

    try:
        result = convert_folder(
            Path(arguments["folder"]),
            Path(arguments["output"]),
            progress=progress,
            outtype=str(arguments.get("outtype") or "f16"),
            sha256=bool(arguments.get("sha256")),
        )
    except LocalLLMError as exc:
        send({"error": str(exc), "kind": type(exc).__name__})
        return 1
    except OSError as exc:
        full = exc.errno == errno.ENOSPC
        send({"error": str(exc), "kind": "disk full" if full else "os"})
        return 1
    summary: dict[str, Any] = {}
    for key in ("architecture", "tensor_count", "bytes_written", "seconds", "sha256"):
        value = getattr(result, key, None)
        if isinstance(value, int | str | float):
            summary[key] = value
    summary["notes"] = [str(note) for note in getattr(result, "notes", None) or []]
    send({"result": summary})
    events.close()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
