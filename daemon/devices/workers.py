"""RPC workers seen from outside llama.cpp: is one up, which protocol, how much memory.

llama.cpp's RPC client aborts the whole process when a worker cannot be reached or answers
wrongly (``GGML_ABORT`` in ``rpc_dispatcher::start``), and waits forever on a worker that
accepts the connection but never answers (an RPC server serves one client at a time). So before
a runner hands an endpoint to llama.cpp, and when the daemon wants to know which worker took a
runner down, it talks to the worker here, with timeouts: TCP connect, the ``HELLO`` handshake
(protocol version), then ``DEVICE_COUNT`` and ``GET_DEVICE_MEMORY`` for each device.

This is a hand-written client of three commands of ggml's RPC protocol (see
``ggml/src/ggml-rpc/ggml-rpc.cpp`` in llama.cpp): nothing in the ecosystem speaks it, and
llama.cpp's own client cannot fail softly. It never imports llama.cpp, so the daemon can use it.
Wire format, little-endian: a request is ``cmd (u8) | size (u64) | payload``; a response is
``size (u64) | payload``.
"""

from __future__ import annotations

import importlib.util
import re
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

__all__ = [
    "PROBE_TIMEOUT_S",
    "RemoteDevice",
    "WorkerStatus",
    "expected_protocol",
    "probe",
    "probe_all",
]

PROBE_TIMEOUT_S = 5.0
"""How long a worker has to accept the connection and answer each command."""

_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
# rpc_msg_hello_req is RPC_CONN_CAPS_SIZE bytes of transport capabilities; all zero asks for
# plain TCP (no RDMA upgrade), which is all a short check needs.
_CONN_CAPS_SIZE = 24
_HELLO_RESPONSE_SIZE = 4 + _CONN_CAPS_SIZE
# The protocol of llama-cpp-python 0.3.36's llama.cpp, used when its header is not installed.
_FALLBACK_PROTOCOL = (7, 0)


@dataclass(frozen=True)
class RemoteDevice:
    """One device a worker exposes (plain data, for the memory plan and reports)."""

    index: int
    """The device's number on its worker."""
    free: int
    """Free memory in bytes, as the worker's backend reports it."""
    total: int
    """Total memory in bytes."""


@dataclass(frozen=True)
class WorkerStatus:
    """What a check of one worker found."""

    endpoint: str
    """``host:port``."""
    problem: str | None = None
    """Why it cannot be used (not running, another protocol, busy), or None when it can."""
    version: tuple[int, int, int] | None = None
    """The RPC protocol version it speaks, once it answered the handshake."""
    devices: list[RemoteDevice] = field(default_factory=list)
    """Its devices with their memory."""
    connected: bool = True
    """Whether it accepted the TCP connection (False: not running, or not reachable)."""

    @property
    def ok(self) -> bool:
        """True when the worker answered everything and speaks this build's protocol."""
        return self.problem is None

    @property
    def free(self) -> int:
        """Free memory over all its devices."""
        return sum(d.free for d in self.devices)


@lru_cache(maxsize=1)
def expected_protocol() -> tuple[int, int]:
    """(major, minor) of the RPC protocol this llama-cpp-python's llama.cpp speaks, read from
    the ``ggml-rpc.h`` its wheel installs (without loading llama.cpp)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return _FALLBACK_PROTOCOL
    package = Path(spec.origin).parent
    for header in (package.parent / "include" / "ggml-rpc.h", package / "include" / "ggml-rpc.h"):
        try:
            text = header.read_text(errors="replace")
        except OSError:
            continue
        major = re.search(r"#define\s+RPC_PROTO_MAJOR_VERSION\s+(\d+)", text)
        minor = re.search(r"#define\s+RPC_PROTO_MINOR_VERSION\s+(\d+)", text)
        if major and minor:
            return int(major.group(1)), int(minor.group(1))
    return _FALLBACK_PROTOCOL


def _receive(connection: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return bytes(data)


def _command(connection: socket.socket, command: int, payload: bytes, answer_size: int) -> bytes:
    connection.sendall(struct.pack("<BQ", command, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _receive(connection, 8))
    if size != answer_size:
        raise ValueError(f"a {size}-byte answer where {answer_size} were expected")
    return _receive(connection, size)


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> WorkerStatus:
    """Check the worker at ``endpoint``: connect, handshake, read its devices' memory.

    Never raises for a worker's fault: the status's ``problem`` says what went wrong, in words
    that complete "RPC worker HOST:PORT ...".
    """
    try:
        host, port = _split(endpoint)
    except ValueError:
        return WorkerStatus(endpoint, "is not host:port")
    try:
        connection = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        return WorkerStatus(
            endpoint, f"did not accept a connection within {timeout:.0f}s", connected=False
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return WorkerStatus(
            endpoint,
            f"is not answering ({reason.lower()}): is `localllm worker --port {port}` running "
            "there, and reachable?",
            connected=False,
        )
    with connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            hello = _command(connection, _CMD_HELLO, bytes(_CONN_CAPS_SIZE), _HELLO_RESPONSE_SIZE)
        except TimeoutError:
            return WorkerStatus(
                endpoint,
                f"accepted the connection but did not answer within {timeout:.0f}s: an RPC "
                "worker serves one client at a time, so another runner (another model, or "
                "another daemon) is probably using it; give each model its own workers",
            )
        except (OSError, ValueError) as exc:
            return WorkerStatus(endpoint, f"does not speak ggml's RPC protocol ({exc})")
        version = (hello[0], hello[1], hello[2])
        major, minor = expected_protocol()
        if version[0] != major or version[1] > minor:
            return WorkerStatus(
                endpoint,
                f"speaks RPC protocol {'.'.join(map(str, version))} and this llama.cpp "
                f"speaks {major}.{minor}: install the same llama-cpp-python version on both "
                "machines",
                version,
            )
        try:
            (count,) = struct.unpack("<I", _command(connection, _CMD_DEVICE_COUNT, b"", 4))
            devices = []
            for index in range(count):
                answer = _command(connection, _CMD_GET_DEVICE_MEMORY, struct.pack("<I", index), 16)
                free, total = struct.unpack("<QQ", answer)
                devices.append(RemoteDevice(index, free, total))
        except (OSError, ValueError) as exc:
            return WorkerStatus(endpoint, f"failed while listing its devices ({exc})", version)
    if not devices:
        return WorkerStatus(endpoint, "exposes no devices", version)
    return WorkerStatus(endpoint, None, version, devices)


def probe_all(endpoints: list[str], timeout: float = PROBE_TIMEOUT_S) -> list[WorkerStatus]:
    """:func:`probe` every endpoint at once (a dead worker costs its timeout once, not once
    per worker), in the order given."""
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=min(len(endpoints), 16)) as pool:
        return list(pool.map(lambda e: probe(e, timeout), endpoints))
