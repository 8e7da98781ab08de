"""The CLI's pure parts, in process: the Modelfile parser, the streaming word wrap, the
``--verbose`` block, ``ps`` and ``show`` rendering, and the chat's input handling."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localllm.cli.models import render_plan, render_show
from localllm.cli.ps import ps_rows
from localllm.cli.repl import Repl
from localllm.cli.session import ChatConfig
from localllm.run_stats import format_duration, format_timings
from localllm.store.modelfile import (
    ModelfileError,
    coerce_parameter,
    parse_modelfile,
    read_modelfile,
)
from localllm.stream_wrap import StreamWrapper

# -- Modelfile ---------------------------------------------------------------------------------


def test_modelfile_instructions_and_value_forms() -> None:
    modelfile = parse_modelfile(
        "# comment\n"
        "from smollm2:135m\n"
        "PARAMETER temperature 0.5\n"
        'PARAMETER stop "<|im_end|>"\n'
        "PARAMETER\tstop   <|x|>\n"
        "PARAMETER num_ctx 2048\n"
        "PARAMETER use_mmap false\n"
        'TEMPLATE """{{ a }}\nb"""\n'
        'SYSTEM """You are "pirate".\nArr."""\n'
        "LICENSE MIT\n"
        'LICENSE """Line 1\nLine 2\n"""\n'
        "MESSAGE user Hi there\n"
        'MESSAGE assistant "Ahoy \\"matey\\""\n'
    )
    assert modelfile.from_ == "smollm2:135m"
    assert modelfile.parameters == {
        "temperature": 0.5,
        "stop": ["<|im_end|>", "<|x|>"],
        "num_ctx": 2048,
        "use_mmap": False,
    }
    assert modelfile.template == "{{ a }}\nb"
    assert modelfile.system == 'You are "pirate".\nArr.'
    assert modelfile.license == ["MIT", "Line 1\nLine 2\n"]
    assert modelfile.messages == [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": 'Ahoy "matey"'},
    ]
    fields = modelfile.create_fields()
    assert fields["license"] == ["MIT", "Line 1\nLine 2\n"] and fields["template"] == "{{ a }}\nb"


def test_a_one_line_triple_quoted_value() -> None:
    assert parse_modelfile('FROM m\nSYSTEM """Be brief."""\n').system == "Be brief."


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("PARAMETER temperature 1\n", "no FROM line"),
        ("FROM a\nFROM b\nFROM c\n", "line 3: at most two FROM lines"),
        ("FROM a\nRUN x\n", "line 2: unknown instruction 'RUN'"),
        ("FROM a\nADAPTER\n", "line 2: ADAPTER needs a LoRA adapter file"),
        ("FROM a\nADAPTER ./x.gguf inf\n", "line 2: ADAPTER's scale must be a finite number"),
        ("FROM a\nPARAMETER nonsense 1\n", "line 2: unknown parameter 'nonsense'"),
        ("FROM a\nPARAMETER num_ctx big\n", "line 2: parameter 'num_ctx' must be an integer"),
        ("FROM a\nPARAMETER seed\n", "line 2: PARAMETER needs a name and a value"),
        ("FROM a\nMESSAGE robot hi\n", "line 2: MESSAGE role must be one of"),
        ('FROM a\nSYSTEM """never\nclosed\n', 'line 2: unterminated """ block'),
        ("FROM\n", "line 1: FROM needs a model name or a file"),
    ],
)
def test_modelfile_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ModelfileError, match=re.escape(message)):
        parse_modelfile(text)


def test_relative_from_is_resolved_next_to_the_modelfile(tmp_path: Path) -> None:
    (tmp_path / "weights.gguf").write_bytes(b"")
    (tmp_path / "Modelfile").write_text("FROM weights.gguf\n")
    assert read_modelfile(tmp_path / "Modelfile").from_ == str(tmp_path / "weights.gguf")
    (tmp_path / "Modelfile").write_text("FROM hf.co/user/repo:Q4_K_M\n")
    assert read_modelfile(tmp_path / "Modelfile").from_ == "hf.co/user/repo:Q4_K_M"
    with pytest.raises(ModelfileError, match="no such Modelfile"):
        read_modelfile(tmp_path / "missing")


def test_parameter_values_are_typed() -> None:
    assert coerce_parameter("num_predict", "16") == 16
    assert coerce_parameter("top_p", "0.9") == 0.9
    assert coerce_parameter("use_mmap", "yes") is True
    assert coerce_parameter("stop", "END") == ["END"]
    with pytest.raises(ModelfileError, match="must be true or false"):
        coerce_parameter("use_mmap", "maybe")


# -- word wrap -------------------------------------------------------------------------------


def _wrapped(pieces: list[str], width: int | None) -> str:
    out: list[str] = []
    wrapper = StreamWrapper(out.append, width)
    for piece in pieces:
        wrapper.feed(piece)
    wrapper.flush()
    return "".join(out)


def test_streamed_text_wraps_between_words() -> None:
    pieces = ["Hello", " world", ", this is", " a long", " sentence that", " should wrap."]
    text = _wrapped(pieces, 20)
    assert text == "Hello world, this is\na long sentence that\nshould wrap."
    assert all(len(line) <= 20 for line in text.splitlines())
    assert _wrapped(pieces, None) == "".join(pieces)


def test_wrap_keeps_newlines_and_indentation_and_counts_wide_characters() -> None:
    assert _wrapped(["def f():\n", "    return 1\n"], 30) == "def f():\n    return 1\n"
    # each CJK character takes two cells: 5 of them fill a 10-cell line
    assert _wrapped(["日本語です ", "こんにちは"], 10) == "日本語です\nこんにちは"


def test_a_word_longer_than_the_line_is_left_to_the_terminal() -> None:
    assert _wrapped(["ab ", "x" * 30, " cd"], 10) == "ab\n" + "x" * 30 + " cd"


# -- --verbose ----------------------------------------------------------------------------


FINAL = {
    "done": True,
    "total_duration": 1_532_000_000,
    "load_duration": 2_100_000,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 40_100_000,
    "eval_count": 16,
    "eval_duration": 1_480_000_000,
    "ttft_duration": 48_210_000,
    "queue_duration": 0,
    "prompt_cached_count": 6,
    "prompt_evaluated_count": 20,
    "prompt_eval_rate": 498.75,
    "eval_rate": 10.81,
}


def test_timings_block_is_aligned_with_both_phases_apart() -> None:
    lines = format_timings(FINAL).splitlines()
    assert lines == [
        "total duration:       1.532s",
        "load duration:        2.10ms",
        "time to first token:  48.21ms",
        "prompt eval count:    20 token(s)",
        "prompt cached count:  6 token(s) reused from cache",
        "prompt eval duration: 40.10ms",
        "prompt eval rate:     498.75 tokens/s",
        "eval count:           16 token(s)",
        "eval duration:        1.480s",
        "eval rate:            10.81 tokens/s",
    ]


def test_timings_say_which_threads_the_answer_ran_with_and_why_fewer() -> None:
    whole = {**FINAL, "threads_min": 2, "threads_max": 2, "threads_of": 2}
    assert format_timings(whole).splitlines()[-1] == "threads:              2 of 2"
    held = {
        **FINAL,
        "threads_min": 1,
        "threads_max": 2,
        "threads_of": 2,
        "threads_why": "CPU busy: other processes use 1.0 of 2 cores",
    }
    assert format_timings(held).splitlines()[-1] == (
        "threads:              1-2 of 2 (CPU busy: other processes use 1.0 of 2 cores)"
    )
    assert "threads" not in format_timings(FINAL)  # an Ollama answer has no such fields


def test_timings_from_a_plain_ollama_chunk_compute_the_rates() -> None:
    plain = {k: v for k, v in FINAL.items() if not k.startswith(("ttft", "prompt_c", "prompt_ev"))}
    plain.update(prompt_eval_count=26, prompt_eval_duration=52_000_000)
    plain.pop("eval_rate")
    text = format_timings(plain)
    assert "time to first token" not in text and "cached" not in text
    assert "prompt eval count:    26 token(s)" in text
    assert "prompt eval rate:     500.00 tokens/s" in text
    assert "eval rate:            10.81 tokens/s" in text


@pytest.mark.parametrize(
    ("nanoseconds", "text"),
    [(310_000, "310µs"), (48_210_000, "48.21ms"), (1_532_000_000, "1.532s"), (123.4e9, "2m3.4s")],
)
def test_durations_for_people(nanoseconds: float, text: str) -> None:
    assert format_duration(nanoseconds) == text


# -- ps and show ------------------------------------------------------------------------------


def test_ps_rows_show_processor_slots_rate_and_expiry() -> None:
    table = ps_rows(
        [
            {
                "name": "smollm2:135m",
                "digest": "fe515e7bb3265ea71ff5",
                "size": 400_000_000,
                "size_vram": 100_000_000,
                "context_length": 4096,
                "slots": 4,
                "busy_slots": 1,
                "decode_tokens_per_s": 42.06,
                "speed": {"predicted": {"decode": 38.6, "prefill": 400.0}},
                "expires_at": "9999-12-31T23:59:59Z",
                "threads": {
                    "decode": 1,
                    "max": 2,
                    "reason": "CPU busy: other processes use 1.0 of 2 cores",
                    "last_change": "2 → 1: CPU busy: other processes use 1.0 of 2 cores",
                },
            },
            {
                "name": "idle:latest",
                "digest": "0123456789abcdef",
                "size": 1_000,
                "size_vram": 1_000,
                "context_length": 2048,
                "slots": 2,
                "active_requests": 0,
                "decode_tokens_per_s": 0.0,
                "expires_at": "2000-01-01T00:00:00Z",
            },
        ]
    )
    header, first, second, why = (line.split() for line in table.splitlines())
    assert header == [
        "NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "THREADS", "TOKENS/S", "PREDICTED",
        "UNTIL",
    ]  # fmt: skip
    assert first == [
        "smollm2:135m",
        "fe515e7bb326",
        "400",
        "MB",
        "75%/25%",
        "CPU/GPU",
        "4096",
        "1/4",
        "1/2",
        "42.1",
        "39",
        "Forever",
    ]
    assert second[4:] == ["100%", "GPU", "2048", "0/2", "-", "-", "-", "Stopping..."]
    # The governor holds a thread back: the line under the table says why.
    assert " ".join(why) == (
        "smollm2:135m threads 1/2: CPU busy: other processes use 1.0 of 2 cores "
        "(last change 2 → 1: CPU busy: other processes use 1.0 of 2 cores)"
    )


def test_ps_marks_pinned_models() -> None:
    entry = {"name": "a", "size": 1, "expires_at": "9999-12-31T23:59:59Z", "pinned": True}
    assert ps_rows([entry]).splitlines()[1].endswith("Forever (pinned)")


def test_show_prints_the_memory_plan_or_why_it_does_not_fit() -> None:
    from localllm.daemon.memory.plan import Device, DeviceUse, MemoryPlan

    mib = 1 << 20
    plan = MemoryPlan(
        n_slots=4,
        n_ctx_per_slot=8192,
        n_gpu_layers=20,
        n_layer=30,
        kv_cells=32768,
        uses=[
            DeviceUse("CPU", weights=40 * mib, kv=240 * mib, compute=10 * mib, layers=11),
            DeviceUse("CUDA0", weights=60 * mib, kv=480 * mib, compute=90 * mib, layers=20),
        ],
        devices=[Device("CPU", "cpu", 8 << 30, 16 << 30), Device("CUDA0", "gpu", 2 << 30, 4 << 30)],
        budgets={"CPU": 7 << 30, "CUDA0": 1792 * mib},
        prefix_cache=512 * mib,
        context_chosen=True,
        warnings=["something to know"],
    )
    text = render_plan({"loaded": False, "plan": plan.to_dict()})
    rows = {line.split("  ")[2].strip(): line for line in text.splitlines()[1:] if line.strip()}
    assert "4 × 8,192 (chosen by free memory)" in rows["slots × context"]
    assert "11 on CPU, 20 on CUDA0 (of 31" in rows["layers"]
    assert (
        "630 MiB of 1,792 MiB usable (weights 60 MiB, KV 480 MiB, compute 90 MiB)" in rows["CUDA0"]
    )
    assert "512 MiB" in rows["prefix cache"] and "something to know" in rows["warning"]
    assert rows["processor"].endswith(plan.processor())
    refused = render_plan({"loaded": False, "refusal": "x needs 9 MiB; 1 MiB are free"})
    assert "does not fit: x needs 9 MiB; 1 MiB are free" in refused


def test_truncation_is_one_line() -> None:
    from localllm.cli.session import truncation_line

    line = truncation_line({"truncated_messages": 3, "truncated_tokens": 912})
    assert line == (
        "(the conversation is longer than the model's context: 3 older messages (912 tokens) "
        "left out)"
    )
    assert "the first 40 tokens" in truncation_line({"truncated_tokens": 40})


def test_show_sections_from_the_api_answer() -> None:
    text = render_show(
        {
            "details": {
                "family": "llama",
                "parameter_size": "134.52M",
                "quantization_level": "Q4_1",
            },
            "model_info": {"general.architecture": "llama", "llama.context_length": 8192},
            "capabilities": ["completion"],
            "parameters": 'stop                           "<|im_end|>"\ntemperature   0.2',
            "system": "Be brief.",
            "license": "MIT\nmore\nand more",
        }
    )
    assert "  Model\n    architecture        llama\n    parameters          134.52M" in text
    assert "context length      8192" in text and "embedding length    unknown" in text
    assert '    stop           "<|im_end|>"' in text and "    temperature    0.2" in text
    assert "  System\n    Be brief." in text
    assert "    MIT\n    more\n    ... (1 more lines; --license shows all)" in text


# -- the interactive chat's input ---------------------------------------------------------------


class _FakeSession:
    """What :class:`Repl` uses of a chat session, recording the messages it would send."""

    def __init__(self) -> None:
        self.config = ChatConfig(model="m")
        self.messages: list[dict[str, str]] = []
        self.asked: list[str] = []
        self.loaded = 0

    def load(self) -> None:
        self.loaded += 1

    def attach_images(self, prompt: str) -> tuple[str, list[str]]:
        return prompt, []

    def answer(self, prompt: str, *, interactive: bool, images: list[str] | None = None) -> str:
        self.asked.append(prompt)
        return "ok"


def _repl(lines: list[str]) -> tuple[_FakeSession, int]:
    feed: Iterator[str] = iter(lines)

    def read(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    session = _FakeSession()
    status = Repl(session, read=read).run()  # type: ignore[arg-type]
    return session, status


def test_repl_reads_multi_line_messages_and_sets_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    session, status = _repl(
        [
            '"""first line',
            "second line",
            'third"""',
            '"""one line"""',
            "/set parameter num_predict 16",
            "/set parameter stop END '<|im_end|>'",
            "/set system You are brief.",
            "/set verbose",
            "/set nowordwrap",
            "/set format json",
            "/set nohistory",
            "   ",
            "plain",
        ]
    )
    assert status == 0 and session.loaded == 1
    assert session.asked == ["first line\nsecond line\nthird", "one line", "plain"]
    config: Any = session.config
    assert config.options == {"num_predict": 16, "stop": ["END", "<|im_end|>"]}
    assert (config.system, config.verbose, config.wordwrap) == ("You are brief.", True, False)
    assert (config.format, config.history) == ("json", False)
    out = capsys.readouterr().out
    assert "Set parameter 'num_predict' to '16'" in out and "Set system message." in out


def test_repl_help_unknown_commands_and_bye(capsys: pytest.CaptureFixture[str]) -> None:
    session, status = _repl(["/?", "/? shortcuts", "/set", "/set parameter", "/what", "/bye", "x"])
    assert status == 0 and session.asked == []  # nothing after /bye is read
    out = capsys.readouterr().out
    assert "/set            Set session variables" in out
    assert "Ctrl + d            Exit" in out
    assert "/set parameter ...     Set a parameter" in out
    assert "/set parameter num_predict <int>" in out
    assert "Unknown command '/what'. Type /? for help" in out
