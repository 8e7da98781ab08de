"""The daemon's reading of a runner's socket (``daemon/runner/lines.py``): lines cut from bytes
however they arrive, routed as they arrive, and the end of the connection (an over-long line
included) still seen by the client, which then fails what it had pending with the reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from localllm.daemon.runner.client import RunnerClient, RunnerDiedError
from localllm.daemon.runner.lines import LineProtocol, LineSplitter
from localllm.daemon.runner.protocol import GenerationRequest


def test_lines_are_cut_however_the_bytes_arrive() -> None:
    lines: list[bytes] = []
    splitter = LineSplitter(lines.append, limit=1 << 10)
    for piece in (b'{"a":', b"1}\n{", b'"b":2}\n{"c":3}\n{"d"', b":4", b"}"):
        splitter.feed(piece)
    assert lines == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    splitter.end()  # the last line without its newline
    assert lines[-1] == b'{"d":4}'
    splitter.end()
    assert len(lines) == 4


def test_a_line_over_the_limit_is_an_error() -> None:
    splitter = LineSplitter(lambda line: None, limit=8)
    splitter.feed(b"12345")
    with pytest.raises(ValueError, match="longer than 8 bytes"):
        splitter.feed(b"67890")


def test_an_over_long_line_ends_the_connection_and_fails_the_pending_request(
    tmp_path: Path,
) -> None:
    # A runner that answers a generation with a line longer than the daemon reads.
    async def main() -> str:
        path = tmp_path / "r.sock"

        async def runner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            writer.write(b'{"event":"prompt_ready","id":"gen-1","prompt_tokens":1}\n')
            writer.write(b"x" * (80 << 20))  # no newline, over the 64 MiB a line may take
            await writer.drain()
            await reader.read()  # until the daemon hangs up

        server = await asyncio.start_unix_server(runner, path=str(path))
        client = await RunnerClient.connect(path)
        try:
            stream = await client.open_generation(GenerationRequest(id="", prompt="hi"))
            with pytest.raises(RunnerDiedError) as died:
                async for _ in stream:
                    pass
            return str(died.value)
        finally:
            await client.close()
            server.close()

    message = asyncio.run(main())
    assert "lost the connection to the runner (a message longer than" in message


def test_bytes_that_arrive_before_the_sink_go_to_it_first_in_order() -> None:
    # A runner that writes as soon as the connection is made reaches the protocol before
    # the client attaches its splitter: those lines still come first, in their order.
    async def main() -> list[bytes]:
        lines: list[bytes] = []
        loop = asyncio.get_running_loop()
        protocol = LineProtocol(asyncio.StreamReader(loop=loop), loop=loop)
        protocol.data_received(b'{"a":1}\n{"b"')
        protocol.data_received(b":2}\n")
        protocol.attach(LineSplitter(lines.append, limit=1 << 10).feed)
        protocol.data_received(b'{"c":3}\n')
        return lines

    assert asyncio.run(main()) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
