"""Images in the TUI chat, on a real daemon with the tiny model and the tiny projector:
``/image PATH`` and a pasted path attach images, their names show above the question, they
are sent with it (the prompt's token count grows against the same question without them, in
the same run) and kept in the saved chat."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_daemon_support import Daemon, running_daemon
from test_tui import connected, last_answer
from test_tui_support import make_app, screen_text, wait_for
from textual import events
from tiny_mmproj import png_bytes, write_tiny_mmproj

from localllm.tui.chats import DB_NAME, ChatStore
from localllm.tui.screens.chat import ChatScreen
from localllm.tui.widgets.message import MessageView
from localllm.tui.widgets.prompt import PromptArea

VISION = "tiny:vision"


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("tui-vision")
    projector = write_tiny_mmproj(folder / "mmproj.gguf")
    with running_daemon(folder / "home", num_parallel=1, num_threads=1) as d:
        with d.client() as client:
            files = {
                "m.gguf": client.upload_blob(tiny_gguf),
                "p.gguf": client.upload_blob(projector),
            }
            list(client.create(VISION, files=files, parameters={"num_predict": 2}))
        yield d


def _notified(app: Any, text: str) -> bool:
    """Whether a notification (a toast) says ``text``."""
    return any(text in notification.message for notification in app._notifications)


@pytest.mark.slow
@pytest.mark.anyio
async def test_attach_images_send_them_and_keep_them(daemon: Daemon, tmp_path: Path) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes((250, 0, 0)))
    spaced = tmp_path / "my cat.jpg"
    spaced.write_bytes(png_bytes((0, 0, 250), fmt="JPEG"))
    (tmp_path / "notes.png").write_text("not an image")
    with daemon.client() as client:
        reference = client.chat(VISION, [{"role": "user", "content": "Describe"}])
    store = ChatStore(tmp_path / DB_NAME)
    chat = store.create_chat("New chat", VISION)
    store.set_meta("current_chat", str(chat.id))
    store.close()

    app = make_app(daemon, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        prompt = screen.query_one("#prompt", PromptArea)

        # /image PATH typed in the message box attaches, sends nothing
        prompt.insert(f"/image {photo}")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(screen.attachments) == 1, "the attachment")
        assert prompt.text == "" and "photo.png (sent with your next message)" in screen_text(app)
        # a file that is no image is refused, named
        prompt.insert(f"/image {tmp_path / 'notes.png'}")
        await pilot.press("enter")
        await wait_for(pilot, lambda: _notified(app, "notes.png is not an image"), "the error")
        assert len(screen.attachments) == 1
        # a pasted (dragged-in) path, quoted as terminals paste it
        prompt.focus()
        app.post_message(events.Paste(f"'{spaced}'"))  # the terminal's paste, to the focus
        await wait_for(pilot, lambda: prompt.text == f"'{spaced}'", "the paste")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(screen.attachments) == 2, "the pasted attachment")

        prompt.insert("Describe")
        await pilot.press("enter")
        current = screen.current
        assert current is not None
        await wait_for(
            pilot, lambda: len(current.messages) == 2 and not screen.answering, "the answer"
        )
        assert screen.attachments == [] and "next message" not in screen_text(app)
        question = list(screen.transcript().query(MessageView).filter(".user"))[-1]
        assert question.attachments == ["photo.png", "my cat.jpg"]
        # the names above the question's text, as the transcript shows them
        children = list(question.children)
        names, body = question.query_one(".attachments"), question.query_one(".body")
        assert children.index(names) < children.index(body)
        shown = screen_text(app)
        assert "🖼 photo.png" in shown and "🖼 my cat.jpg" in shown
        stats = last_answer(screen).stats or {}
        assert "error" not in stats
        # the images were evaluated: more prompt tokens than the same question alone
        sent = stats["prompt_eval_count"] + stats.get("prompt_cached_count", 0)
        assert sent > reference["prompt_eval_count"]

    store = ChatStore(tmp_path / DB_NAME)
    saved = next(c for c in store.list_chats() if c.id == chat.id)
    store.close()
    asked = saved.messages[-2]
    assert [image.name for image in asked.images] == ["photo.png", "my cat.jpg"]
    assert base64.b64decode(asked.images[0].data) == photo.read_bytes()
    assert saved.request_messages()[-2]["images"] == [i.data for i in asked.images]
