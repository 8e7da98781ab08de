"""``until_disconnect``: a generation's way to the runner runs in the request's own task and
ends with ``ClientGone`` as soon as the client goes, its work cancelled (its cleanup run);
otherwise its value or its error, and a cancellation from outside stays one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from localllm.daemon.errors import ClientGone
from localllm.daemon.generation import until_disconnect


def _request(messages: asyncio.Queue[dict[str, Any]]) -> Request:
    """A request whose ASGI ``receive`` gives what is put on ``messages``."""
    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    return Request(scope, messages.get)


def test_the_work_is_cancelled_when_the_client_goes() -> None:
    async def main() -> list[str]:
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        seen: list[str] = []

        async def work() -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append("cleaned up")
                raise
            return "never"

        async def leave() -> None:
            await asyncio.sleep(0.05)
            await messages.put({"type": "http.disconnect"})

        leaving = asyncio.ensure_future(leave())
        with pytest.raises(ClientGone):
            await until_disconnect(_request(messages), work())
        await leaving
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the task itself goes on
        await asyncio.sleep(0)  # and is not cancelled afterwards
        seen.append("went on")
        return seen

    assert asyncio.run(main()) == ["cleaned up", "went on"]


def test_a_client_gone_before_the_work_waits_is_noticed() -> None:
    async def main() -> None:
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await messages.put({"type": "http.disconnect"})
        with pytest.raises(ClientGone):
            await until_disconnect(_request(messages), asyncio.sleep(30))

    asyncio.run(main())


def test_the_value_or_the_error_of_the_work() -> None:
    async def main() -> None:
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def value() -> int:
            await asyncio.sleep(0.01)
            return 7

        async def now() -> int:  # never waits
            return 8

        async def fails() -> None:
            await asyncio.sleep(0)
            raise ValueError("the runner refused it")

        assert await until_disconnect(_request(messages), value()) == 7
        assert await until_disconnect(_request(messages), now()) == 8
        with pytest.raises(ValueError, match="refused"):
            await until_disconnect(_request(messages), fails())
        # a disconnect after the work is over changes nothing
        await messages.put({"type": "http.disconnect"})
        await asyncio.sleep(0.01)
        assert len(asyncio.all_tasks()) == 1  # no watcher left behind

    asyncio.run(main())


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    async def main() -> None:
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        waiting = asyncio.ensure_future(until_disconnect(_request(messages), asyncio.sleep(30)))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
