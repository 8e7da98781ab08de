"""``localllm bench --conversation``: a replayed multi-turn trace against a real daemon serving
the starter model (SmolLM2-135M) with fewer slots than users. The shape only: how many requests
each turn sent, that every one ended with an answer, that histories grow and come back cached,
that turns run interleaved with the ``--against`` target and give ratios per turn, and the
table and charts. Never timings, never the model's words."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from test_daemon_support import Daemon, running_daemon

from localllm.bench import JSON_SCHEMA, BenchError
from localllm.bench.conversation import Conversation, Histories, parse_conversation
from localllm.bench.load import PromptMaker

MODEL = "starter:conv"
USERS, TURNS, SLOTS = 3, 2, 2
SYSTEM_TOKENS = 48  # (the default 256 only made the runner work longer)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> Iterator[Daemon]:
    """A daemon with fewer slots than the trace has users."""
    home = tmp_path_factory.mktemp("conversation") / "home"
    with running_daemon(home, num_parallel=SLOTS, num_threads=2, context_length=2048) as daemon:
        with daemon.client() as client:
            for _ in client.create(MODEL, from_=str(smollm2_gguf)):
                pass
        yield daemon


def test_a_conversation_trace_against_a_second_target(daemon: Daemon, tmp_path: Path) -> None:
    out = tmp_path / "conversation.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "localllm", "bench", MODEL,
            "--conversation", f"{USERS}x{TURNS}", "--answer-tokens", "4",
            "--system-tokens", str(SYSTEM_TOKENS), "--turn-tokens", "16",
            "--against", daemon.url, "--against-model", MODEL, "--json", str(out),
        ],
        env={**daemon.env, "COLUMNS": "140"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = json.loads(out.read_text())
    jsonschema.validate(document, JSON_SCHEMA)
    assert document["workload"]["conversation"]["users"] == USERS
    assert document["workload"]["conversation"]["system_tokens"] == SYSTEM_TOKENS
    assert document["workload"]["conversation"]["turn_tokens"] == 16
    samples = document["samples"]
    labels = [t["label"] for t in document["targets"]]
    assert len(labels) == 2
    # Only the conversation ran: every user once per turn on each target, and every request
    # ended with its answer.
    assert {s["sweep"] for s in samples} == {"conversation"}
    assert len(samples) == 2 * USERS * TURNS
    assert all(s["ok"] and s["tokens"] >= 1 and s["error"] is None for s in samples)
    for label in labels:
        for turn in range(1, TURNS + 1):
            mine = [
                s for s in samples if s["target"] == label and s["prompt_tokens_target"] == turn
            ]
            assert sorted(s["client"] for s in mine) == list(range(USERS))
    # Interleaved: each turn ran on both targets before the next turn began.
    turns = [s["prompt_tokens_target"] for s in samples]
    assert turns == sorted(turns)
    # Histories grow: every user's second prompt is longer than the first, and it starts with
    # what the first turn left in the cache (the system prompt at least).
    for label in labels:
        by_user = {
            (s["client"], s["prompt_tokens_target"]): s for s in samples if s["target"] == label
        }
        for user in range(USERS):
            first, second = by_user[(user, 1)], by_user[(user, 2)]
            assert second["prompt_tokens"] > first["prompt_tokens"]
            assert second["cached_tokens"] > 0
    points = [p for p in document["points"] if p["sweep"] == "conversation"]
    assert {(p["target"], p["prompt_tokens"]) for p in points} == {
        (label, turn) for label in labels for turn in range(1, TURNS + 1)
    }
    assert all(p["requests"] == USERS and p["failed"] == 0 for p in points)
    ratios = [r for r in document["ratios"] if r["sweep"] == "conversation"]
    assert sorted(r["prompt_tokens"] for r in ratios) == list(range(1, TURNS + 1))
    assert all(r["ttft_p50_ms"] > 0 and r["ttft_p95_ms"] > 0 for r in ratios)
    text = result.stdout
    assert "Conversation" in text and f"{USERS} users × {TURNS} turns" in text
    rows = [line.split() for line in text.splitlines()]
    for turn in range(1, TURNS + 1):
        assert ["localllm", str(turn), str(USERS), f"{USERS}/{USERS}"] in [r[:4] for r in rows]
    assert "conversation: TTFT per turn" in text and "┤" in text


def test_histories_keep_the_shared_system_prompt_and_the_answers() -> None:
    shape = Conversation(users=2, turns=2, system_tokens=32, turn_tokens=8)
    history = Histories(shape, PromptMaker(nonce="n"), "t")
    first = history.prompts_for(0)
    system = first[0].split("### User")[0]
    assert all(prompt.startswith(system) for prompt in first)
    assert first[0] != first[1]
    history.answered(first, ["one answer", ""])
    second = history.prompts_for(1)
    assert second[0].startswith(first[0] + "one answer\n")
    assert second[1].startswith(first[1])
    assert all(prompt.endswith("### Assistant\n") for prompt in second)


def test_a_conversation_shape_is_parsed_or_refused() -> None:
    assert (parse_conversation("16x3").users, parse_conversation("16x3").turns) == (16, 3)
    assert parse_conversation("5").turns == 3
    for bad in ("x3", "0x3", "4x0", "many"):
        with pytest.raises(BenchError):
            parse_conversation(bad)


def test_the_conversations_lengths_are_options_of_a_conversation_only() -> None:
    from localllm.cli.bench import _workload
    from localllm.cli.common import UsageError
    from localllm.cli.parser import build_parser

    parser = build_parser()
    args = parser.parse_args(["bench", MODEL, "--conversation", "4x2", "--system-tokens", "9"])
    shape = _workload(args).conversation
    assert shape is not None and (shape.system_tokens, shape.turn_tokens) == (9, 48)
    with pytest.raises(UsageError, match="--turn-tokens: only with --conversation"):
        _workload(parser.parse_args(["bench", MODEL, "--turn-tokens", "9"]))
    with pytest.raises(UsageError, match="1 token or more"):
        _workload(parser.parse_args(["bench", MODEL, "--conversation", "4", "--turn-tokens", "0"]))
