"""The synchronous client is written from the asynchronous one (``localllm.client._unasync``):
the checked-in ``_sync_client.py`` must be what the generator writes today."""

from __future__ import annotations

from localllm.client import _unasync


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    source = _unasync.SOURCE.read_text(encoding="utf-8")
    expected = _unasync.generate(source)
    assert "async " not in expected and "await " not in expected
    assert _unasync.TARGET.read_text(encoding="utf-8") == expected, (
        "localllm/client/_sync_client.py is stale: run python -m localllm.client._unasync"
    )
