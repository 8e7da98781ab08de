"""The runner's connection: the engine's thread writes token lines itself while nothing waits
to go before them, and the order on the wire is the order of the events, whoever writes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from localllm.daemon.runner.connection import Connection
from localllm.daemon.runner.protocol import (
    DoneEvent,
    GenerationResult,
    PromptReadyEvent,
    Timings,
    TokenEvent,
    decode,
)


async def _serve(path: Path, body: object) -> tuple[asyncio.AbstractServer, asyncio.Future]:
    """A unix socket server whose one connection is handed to ``body`` on an engine-like
    thread; the future gets the connection when the thread is done."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(writer, loop)
        connection.send(PromptReadyEvent(id="r", prompt_tokens=3))  # the loop's own write

        def engine() -> None:
            try:
                body(connection)  # type: ignore[operator]
            except BaseException as exc:
                loop.call_soon_threadsafe(done.set_exception, exc)
            else:
                loop.call_soon_threadsafe(done.set_result, connection)

        threading.Thread(target=engine).start()
        try:
            await done
            await reader.read()  # until the client closes
        finally:
            connection.close()

    server = await asyncio.start_unix_server(handle, path=str(path))
    return server, done


def _tokens_then_done(count: int, size: int = 1):
    def body(connection: Connection) -> None:
        emit = connection.emitter()
        for index in range(count):
            emit.many([TokenEvent("r", f"{index}:" + "x" * size)])
        result = GenerationResult(id="r", text="", done_reason="stop", timings=Timings())
        emit(DoneEvent("r", result))

    return body


async def _read_all(path: Path, slow: asyncio.Future | None = None) -> list[object]:
    reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
    if slow is not None:
        await slow  # read nothing until the engine has written (or queued) everything
    events = []
    while True:
        line = await reader.readline()
        assert line, "the connection closed before the done event"
        event = decode(line)
        events.append(event)
        if isinstance(event, DoneEvent):
            break
    writer.close()
    return events


def test_token_lines_are_written_by_the_engine_thread_in_order(tmp_path: Path) -> None:
    async def main() -> tuple[list[object], Connection]:
        server, done = await _serve(tmp_path / "s.sock", _tokens_then_done(200))
        events = await asyncio.wait_for(_read_all(tmp_path / "s.sock"), 120)
        connection = await done
        server.close()
        return events, connection

    events, connection = asyncio.run(main())
    assert isinstance(events[0], PromptReadyEvent)
    texts = [e.text for e in events if isinstance(e, TokenEvent)]
    assert [t.split(":")[0] for t in texts] == [str(i) for i in range(200)]
    assert isinstance(events[-1], DoneEvent)
    assert connection.direct_writes > 0  # the loop was not woken for those
    assert not connection.active


def test_a_full_socket_sends_the_rest_through_the_loop_in_order(tmp_path: Path) -> None:
    """A client that reads nothing while 16 MiB of tokens are emitted: the socket fills, the
    rest queues behind what it did not take, and every line arrives whole and in order."""

    async def main() -> tuple[list[object], Connection]:
        server, done = await _serve(tmp_path / "s.sock", _tokens_then_done(256, 64 << 10))
        events = await asyncio.wait_for(_read_all(tmp_path / "s.sock", slow=done), 120)
        connection = await done
        server.close()
        return events, connection

    events, connection = asyncio.run(main())
    texts = [e.text for e in events if isinstance(e, TokenEvent)]
    assert [t.split(":")[0] for t in texts] == [str(i) for i in range(256)]
    assert all(len(t) == len(t.split(":")[0]) + 1 + (64 << 10) for t in texts)
    assert isinstance(events[-1], DoneEvent)
    assert 0 < connection.direct_writes < 256  # some went straight out, the rest queued


def test_the_prompt_ready_event_goes_first_though_the_engine_emitted_before_it_was_written(
    tmp_path: Path,
) -> None:
    """``send_after``: the engine gets the request before the acceptance is written, and
    whatever it emits meanwhile (here: everything, the thread joined) follows the acceptance."""

    async def main() -> tuple[list[object], Connection]:
        loop = asyncio.get_running_loop()
        connections: list[Connection] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connection = Connection(writer, loop)
            connections.append(connection)

            def submit() -> None:
                engine = threading.Thread(target=_tokens_then_done(50), args=(connection,))
                engine.start()
                engine.join()

            connection.send_after(PromptReadyEvent(id="r", prompt_tokens=3), submit)
            try:
                await reader.read()
            finally:
                connection.close()

        server = await asyncio.start_unix_server(handle, path=str(tmp_path / "s.sock"))
        events = await asyncio.wait_for(_read_all(tmp_path / "s.sock"), 120)
        server.close()
        return events, connections[0]

    events, connection = asyncio.run(main())
    assert isinstance(events[0], PromptReadyEvent)
    texts = [e.text for e in events if isinstance(e, TokenEvent)]
    assert [t.split(":")[0] for t in texts] == [str(i) for i in range(50)]
    assert isinstance(events[-1], DoneEvent)
    assert connection.direct_writes == 0  # the acceptance was waiting: nothing overtook it
