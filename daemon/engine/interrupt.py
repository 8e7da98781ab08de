"""Stopping the engine's idle-time decodes the moment a request arrives.

While no request waits the engine measures what decodes of 1 to 8 tokens cost (for
speculation, :mod:`..speculation.drafting`) on a scratch sequence. A request that arrives
during one of those decodes waited for the whole of it: after a model's load, a first message
waited up to an 8-token decode (for an 8B model on a CPU, most of a second). llama.cpp stops a
decode when its abort callback says so: on the CPU it asks between two nodes of the graph
(``ggml_graph_compute_thread``), so the request waits a node, not the decode.

The callback is asked at every node, and a Python callback would take the GIL each time: a
measured decode would then wait on the event loop's thread and measure that. So the callback
is C code that needs no interpreter: libc's ``strlen`` of a two-byte buffer, 0 while its
first byte is 0 and 1 once another thread has set it (a ``bool`` returned in the low bits of
the return register, which both 0 and 1 fill whole). Where libc cannot be found (or on a
backend that never asks, a GPU's) a decode runs to its end, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import llama_cpp

__all__ = ["DecodeInterrupt"]


def _strlen_address() -> int | None:
    """The address of the C library's ``strlen``, or None where it cannot be found."""
    try:
        if sys.platform == "win32":
            libc = ctypes.CDLL(ctypes.util.find_library("msvcrt") or "msvcrt")
        else:
            libc = ctypes.CDLL(None)  # the process's own symbols: libc is among them
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    return address or None


class _Expecting:
    """:meth:`DecodeInterrupt.expecting`'s block (one object, reused: it is on every
    request's way; entered and left on the runner's event loop only, so no lock)."""

    def __init__(self, interrupt: DecodeInterrupt) -> None:
        self._interrupt = interrupt

    def __enter__(self) -> None:
        self._interrupt._on_the_way += 1
        self._interrupt.set()

    def __exit__(self, *exc: object) -> None:
        self._interrupt._on_the_way -= 1


class DecodeInterrupt:
    """A flag another thread sets to stop a decode run under it (see the module's text).

    ``clear`` before deciding to start idle work, then look for waiting work, then decode:
    a request queued after the clear sets the flag, so it is never missed."""

    def __init__(self) -> None:
        self._flag = ctypes.create_string_buffer(2)
        address = _strlen_address()
        self._callback = None if address is None else llama_cpp.ggml_abort_callback(address)
        self._on_the_way = 0
        self._expecting = _Expecting(self)

    @property
    def expected(self) -> bool:
        """Whether requests are on their way to the engine (see :meth:`expecting`)."""
        return self._on_the_way > 0

    def expecting(self) -> _Expecting:
        """A request is on its way while the block it opens runs (the runner prepares its
        prompt): the flag is raised, and the engine starts no idle work meanwhile, whose
        Python would take the GIL from the preparation, 5 ms a time."""
        return self._expecting

    @property
    def available(self) -> bool:
        """Whether decodes can be stopped at all here."""
        return self._callback is not None

    def clear(self) -> None:
        """Lower the flag (the engine thread, before it looks for waiting work)."""
        self._flag[0] = b"\x00"

    def set(self) -> None:
        """Raise the flag: a decode run under it stops at its next node (any thread)."""
        self._flag[0] = b"\x01"

    @property
    def is_set(self) -> bool:
        """Whether the flag is raised."""
        return self._flag[0] != b"\x00"

    def decode(self, ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
        """``llama_decode`` under the flag: 2 (llama.cpp's "aborted", the batch's cells
        removed again) when the flag was raised before or during it (llama.cpp asks after
        each node, the first included)."""
        if self._callback is None:
            return int(llama_cpp.llama_decode(ctx, batch))
        llama_cpp.llama_set_abort_callback(
            ctx, self._callback, ctypes.cast(self._flag, ctypes.c_void_p)
        )
        try:
            return int(llama_cpp.llama_decode(ctx, batch))
        finally:
            llama_cpp.llama_set_abort_callback(ctx, llama_cpp.ggml_abort_callback(), None)
