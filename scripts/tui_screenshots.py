"""Take the terminal UI's screenshots for docs/tui.md (SVG, as Textual saves them): a chat with
a regenerated answer (branch 2/2), the prompt library, and two models compared side by side.

    python scripts/tui_screenshots.py [OUT_DIR]     # default: docs/images

It runs a real daemon on loopback (the test suite's helpers, in tests/support/) with the starter
SmolLM2 and a copy of it with another system prompt, and drives the app with Textual's Pilot.
The answers are whatever the model says on this machine.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from test_daemon_support import running_daemon  # noqa: E402
from test_tui_support import make_app  # noqa: E402

from localllm.chats import DB_NAME, ChatStore  # noqa: E402
from localllm.tui.screens.chat import ChatScreen  # noqa: E402
from localllm.tui.screens.compare import CompareScreen  # noqa: E402
from localllm.tui.screens.library import PromptLibrary  # noqa: E402

SMOL = "smollm2:135m"
SIZE = (110, 32)


async def _until(pilot, condition: Callable[[], object], timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there")
        await pilot.pause(0.1)


async def _shoot(daemon, data: Path, out: Path) -> None:  # type: ignore[no-untyped-def]
    store = ChatStore(data / DB_NAME)
    chat = store.create_chat("New chat", SMOL, options={"num_predict": 24, "temperature": 0.8})
    store.set_meta("current_chat", str(chat.id))
    store.save_prompt("pirate", "You are a pirate. Answer as one, briefly.")
    store.save_prompt("reviewer", "You review code. Point out bugs first, then style.")
    store.save_prompt("terse", "Answer in one sentence.")
    store.close()
    app = make_app(daemon, data)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _until(pilot, lambda: len(screen.models) >= 2)
        chat_now = screen.current
        assert chat_now is not None

        await pilot.press(*"Give me a name for a cat.", "enter")
        await _until(pilot, lambda: len(chat_now.all_messages()) >= 2 and not screen.answering)
        await pilot.press("ctrl+r")
        await _until(pilot, lambda: len(chat_now.all_messages()) >= 3 and not screen.answering)
        await pilot.press(*"And one for a dog?", "enter")
        await _until(pilot, lambda: len(chat_now.all_messages()) >= 5 and not screen.answering)
        await pilot.pause(0.5)
        app.save_screenshot("tui-branches.svg", str(out))

        await pilot.press("ctrl+s")
        await _until(pilot, lambda: isinstance(app.screen, PromptLibrary))
        library = app.screen
        await _until(pilot, lambda: library.prompts)
        library.show_prompt("pirate")
        await pilot.pause(0.5)
        app.save_screenshot("tui-prompt-library.svg", str(out))
        await pilot.press("escape")

        await pilot.press(*"Why is the sea salty?", "f12")
        await _until(pilot, lambda: isinstance(app.screen, CompareScreen))
        compare = app.screen
        await _until(pilot, lambda: compare.fits is not None)
        await pilot.press("ctrl+s")
        await _until(pilot, lambda: compare.columns and all(c.answer for c in compare.columns))
        await pilot.pause(0.5)
        app.save_screenshot("tui-compare.svg", str(out))
        await pilot.press("1")


def main() -> None:
    """Take the three screenshots into the folder named (docs/images by default)."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory() as folder,
        running_daemon(Path(folder) / "home", num_parallel=1, num_threads=2) as daemon,
    ):
        with daemon.client() as client:
            for _ in client.create("pirate", from_=SMOL, system="You are a pirate."):
                pass
        asyncio.run(_shoot(daemon, Path(folder) / "data", out))
    print(f"wrote {out}/tui-branches.svg, tui-prompt-library.svg, tui-compare.svg")


if __name__ == "__main__":
    main()
