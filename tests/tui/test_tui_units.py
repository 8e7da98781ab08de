"""Pieces of the terminal UI that need no daemon: text formatting, the chat database, widget
tree changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from localllm.tui.chats import ChatStore, StoredMessage
from localllm.tui.dom import settle
from localllm.tui.format import answer_stats, chat_title, countdown, transfer_line
from localllm.tui.screens.models import details_markdown
from localllm.tui.widgets.loaded_model import slot_text, threads_text

FINAL = {
    "ttft_duration": 85_000_000,
    "prompt_eval_rate": 1234.5,
    "eval_rate": 95.25,
    "prompt_cached_count": 12,
    "eval_count": 48,
    "done_reason": "length",
}


def test_answer_stats_line() -> None:
    line = answer_stats(FINAL)
    assert line == (
        "TTFT 85 ms · prefill 1,234 tok/s · decode 95.2 tok/s · 12 cached · 48 tokens"
        " · cut at the token limit"
    )
    assert answer_stats({**FINAL, "ttft_duration": 1_500_000_000}).startswith("TTFT 1.50 s")
    assert answer_stats({"done_reason": "stopped"}) == "stopped"
    assert answer_stats({"error": "model not found"}) == "error: model not found"
    assert answer_stats(None) == ""


def test_countdown_and_titles() -> None:
    assert countdown(None, 100.0) == "stays loaded"
    assert countdown(99.0, 100.0) == "unloading"
    assert countdown(100.0 + 272, 100.0) == "unloads in 4:32"
    assert countdown(100.0 + 3723, 100.0) == "unloads in 1:02:03"
    assert chat_title("  What is a llama?\nMore text") == "What is a llama?"
    long = chat_title("x" * 80)
    assert len(long) == 32 and long.endswith("…")
    assert transfer_line(2_000_000, 5_000_000, 1_000_000) == "2.0 MB / 5.0 MB · 1.0 MB/s · 3s left"
    assert transfer_line(5, 5, None) == "5 B / 5 B"


def test_a_cards_threads_line_says_why_the_governor_holds_threads_back() -> None:
    assert threads_text(None).plain == ""
    assert threads_text({"decode": 2, "max": 2, "mode": "auto"}).plain == "CPU threads 2 of 2"
    held = threads_text(
        {"decode": 1, "max": 2, "mode": "auto", "reason": "CPU busy: other processes need 1.0"}
    )
    assert held.plain == "CPU threads 1 of 2 · CPU busy: other processes need 1.0"
    assert any("yellow" in str(span.style) for span in held.spans)
    assert threads_text({"decode": 1, "max": 1, "mode": "fixed"}).plain == (
        "CPU threads 1 of 1 (fixed)"
    )


def test_slot_text_and_details() -> None:
    slots = [
        {"state": "decode", "generated_tokens": 7},
        {"state": "prefill", "prompt_tokens": 200, "prefilled_tokens": 50},
        {"state": "idle"},
    ]
    assert slot_text(slots).plain.split() == [
        "●",
        "decoding",
        "7",
        "◐",
        "prefilling",
        "25%",
        "○",
        "idle",
    ]
    text = details_markdown(
        "m:1b",
        {
            "details": {"family": "llama", "parameter_size": "1B", "quantization_level": "Q8_0"},
            "model_info": {"llama.context_length": 8192},
            "capabilities": ["completion"],
            "parameters": 'stop "<|im_end|>"',
            "template": "\n".join(f"line {i}" for i in range(20)),
            "license": "MIT\nmore",
        },
    )
    assert "### m:1b" in text and "context **8,192**" in text and "**Q8_0**" in text
    assert "line 7" in text and "line 8" not in text and "**License** MIT" in text


def test_chat_store_round_trip(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3", clock=lambda: 1.0)
    first = store.create_chat("One", "m:1", "Be brief.", {"temperature": 0.5})
    second = store.create_chat("Two")
    store.add_message(first.id, StoredMessage("user", "Hi"))
    store.add_message(first.id, StoredMessage("assistant", "Hello", FINAL))
    first.title, first.model = "Renamed", "m:2"
    store.update_chat(first)
    store.set_meta("current_chat", str(second.id))
    store.set_meta("current_chat", str(first.id))
    store.close()

    again = ChatStore(tmp_path / "chats.sqlite3")
    chats = again.list_chats()
    assert [c.title for c in chats] == ["Renamed", "Two"]
    assert chats[0].model == "m:2" and chats[0].options == {"temperature": 0.5}
    assert chats[0].messages[1].stats == FINAL and chats[0].last_answer() == "Hello"
    assert chats[0].request_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert again.get_meta("current_chat") == str(first.id)
    assert again.get_meta("missing") is None
    again.delete_chat(first.id)
    assert [c.title for c in again.list_chats()] == ["Two"]
    assert again._run("SELECT COUNT(*) FROM messages")[1] == [(0,)]  # cascaded


def test_a_removal_awaited_by_a_cancelled_task_still_completes() -> None:
    # Textual waits for removed widgets by gathering their message pumps: a worker cancelled
    # while awaiting that (an exclusive worker replaced, a closing screen) cancelled the
    # pumps, leaving widgets that never answered again; the pilot then gave up on them after
    # 30 s, and the app's exit raised CancelledError. settle() keeps the removal out of the
    # caller's cancellation.
    class Lines(App[None]):
        def compose(self) -> ComposeResult:
            with Vertical(id="box"):
                for number in range(5):
                    yield Static(f"line {number}")

    async def scenario() -> tuple[int, bool]:
        app = Lines()
        async with app.run_test() as pilot:
            box = app.query_one("#box")

            async def remove_lines() -> None:
                await settle(box.remove_children())

            task = asyncio.create_task(remove_lines())
            await asyncio.sleep(0)  # it runs up to the removal's wait
            task.cancel()
            for _ in range(100):
                await pilot.pause(0.01)  # waits for every widget to answer
                if not box.children:
                    break
            return len(box.children), task.done()

    assert asyncio.run(scenario()) == (0, True)


def test_the_app_is_what_the_screens_take_it_for(tmp_path: Path) -> None:
    """The screens are typed against the ``Host`` protocol, not the app class: the app must
    keep offering every member the protocol names."""
    import inspect

    from localllm.settings import Settings
    from localllm.tui.app import LocalLLMApp
    from localllm.tui.host import Host

    members = set(Host.__annotations__) | {
        name for name, _ in inspect.getmembers(Host) if not name.startswith("_")
    }
    assert {"client", "chats", "connection", "daemon_lost"} <= members
    app = LocalLLMApp(Settings.from_env({"LOCALLLM_HOME": str(tmp_path)}), autostart=False)
    try:
        for name in members:
            assert hasattr(app, name), name
        assert callable(app.daemon_lost)
    finally:
        app.chats.close()
        asyncio.run(app.client.close())
