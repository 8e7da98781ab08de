"""Quantization through llama.cpp in a child process: every target, refusals, crashes, cancel."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest
from fakes.gguf_split import split_gguf
from fakes.helpers import EventLog

from localllm import OperationCancelledError, QuantizeError
from localllm.gguf_info import inspect_gguf
from localllm.sources.assemble import assemble_manifest
from localllm.store.manifest import MEDIA_MODEL
from localllm.store.models import create_model, load_model, quantize_model
from localllm.store.names import parse_name
from localllm.store.store import Store

pytest_plugins = ["fakes.fixtures"]

PROMPT = b"the sky is"
N_TOKENS = 8


def greedy_tokens(path: Path) -> list[int]:
    """Token ids of a short greedy generation, with llama-cpp-python's high-level class."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=64, n_threads=1, verbose=False)
    try:
        tokens: list[int] = []
        for token in llm.generate(llm.tokenize(PROMPT), temp=0.0, top_k=1):
            tokens.append(token)
            if len(tokens) == N_TOKENS:
                return tokens
        return tokens
    finally:
        llm.close()


@pytest.fixture(scope="module")
def source_store(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Store:
    """A store holding ``tiny`` (the F32 model) with system, params and license layers."""
    store = Store(tmp_path_factory.mktemp("quantize-store"))
    create_model(
        store,
        "tiny",
        gguf_file=tiny_gguf,
        system="You are tiny.",
        parameters={"temperature": 0.5, "stop": ["<|im_end|>"]},
        license="MIT",
    )
    return store


@pytest.fixture(scope="module")
def f32_tokens(tiny_gguf: Path) -> list[int]:
    return greedy_tokens(tiny_gguf)


# (what the user types, the file type it must produce, whether greedy output must equal F32's)
TARGETS = [
    ("q4_0", "Q4_0", False),
    ("q4_K_S", "Q4_K_S", False),
    ("q4_K", "Q4_K_M", False),
    ("Q4_K_M", "Q4_K_M", False),
    ("q5_K_M", "Q5_K_M", False),
    ("q6_K", "Q6_K", False),
    ("Q8_0", "Q8_0", True),
    ("f16", "F16", True),
    ("F32", "F32", True),
]


@pytest.mark.parametrize(("quant", "file_type", "same_as_f32"), TARGETS)
def test_quantize_to_each_type_and_generate(
    source_store: Store,
    f32_tokens: list[int],
    quant: str,
    file_type: str,
    same_as_f32: bool,
) -> None:
    log = EventLog()
    target = f"tiny:{quant.lower()}"
    entry = quantize_model(source_store, "tiny", target, quant, on_progress=log)

    model = load_model(source_store, target)
    assert model.info.file_type == file_type
    # Everything but the GGUF is the source's, blob for blob.
    source = source_store.get("tiny").manifest
    kept = [layer for layer in entry.manifest.layers if layer.media_type != MEDIA_MODEL]
    assert kept == [layer for layer in source.layers if layer.media_type != MEDIA_MODEL]
    assert model.system == "You are tiny." and model.parameters["temperature"] == 0.5

    # Per-tensor progress, in bytes of the source's tensors, as Ollama's create reports.
    status = f"quantizing F32 model to {file_type}"
    steps = [e for e in log.events if e.status == status]
    source_info = inspect_gguf(load_model(source_store, "tiny").gguf_path)
    assert len(steps) >= len(source_info.tensors)
    assert {e.total for e in steps} == {source_info.weights_bytes}
    completed = [e.completed for e in steps]
    assert completed[0] == 0 and completed[-1] == source_info.weights_bytes
    assert completed == sorted(completed)
    assert log.statuses[-1] == "writing manifest"

    tokens = greedy_tokens(model.gguf_path)
    assert len(tokens) == N_TOKENS and all(0 <= t < (model.info.vocab_size or 0) for t in tokens)
    if same_as_f32:
        assert tokens == f32_tokens


def test_quantized_input_is_refused_without_the_flag(
    store: Store, smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = []
    monkeypatch.setattr("localllm.store.quantize._child_command", lambda args: started.append(args))
    with pytest.raises(QuantizeError) as info:
        quantize_model(store, smollm2_gguf, "smol:q8_0", "q8_0")
    assert str(info.value).startswith(
        "quantization is only supported for F16, BF16 and F32 models "
        "(SmolLM2-135M-Instruct.Q4_1.gguf is Q4_1;"
    )
    assert started == [] and not store.exists("smol:q8_0")


def test_requantizing_smollm2_with_the_flag(store: Store, smollm2_gguf: Path) -> None:
    log = EventLog()
    entry = quantize_model(
        store, smollm2_gguf, "smol:q8_0", "q8_0", allow_requantize=True, on_progress=log
    )
    info = load_model(store, entry.name).info
    assert info.file_type == "Q8_0"
    assert info.parameter_count == inspect_gguf(smollm2_gguf).parameter_count
    assert log.events[0].status == "quantizing Q4_1 model to Q8_0"


def test_unknown_target_lists_the_supported_ones(source_store: Store) -> None:
    with pytest.raises(QuantizeError, match=r"unsupported quantization type 'q3_K_S'; use one of"):
        quantize_model(source_store, "tiny", "tiny:q3", "q3_K_S")


@pytest.mark.parametrize(
    ("signal_name", "says"),
    [
        ("SIGSEGV", r"llama\.cpp crashed \(SIGSEGV \(segmentation fault\)\)"),
        # An instruction this CPU cannot run: the remedy is a build for this CPU.
        ("SIGILL", r"crashed \(SIGILL \(illegal instruction\)\).*-DGGML_NATIVE=OFF"),
    ],
)
def test_a_crashing_child_is_an_error_not_a_crash(
    store: Store, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, signal_name: str, says: str
) -> None:
    crash = f"import os, signal; os.kill(os.getpid(), signal.{signal_name})"
    monkeypatch.setattr(
        "localllm.store.quantize._child_command", lambda args: [sys.executable, "-c", crash]
    )
    with pytest.raises(QuantizeError, match=says):
        quantize_model(store, tiny_gguf, "tiny:q8_0", "q8_0")
    assert not store.exists("tiny:q8_0")
    assert not list(store.partial_dir.glob("tmp-*"))


def test_llama_cpp_errors_come_back_with_their_message(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "alien.gguf"
    writer = gguf.GGUFWriter(str(path), "alien")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tensor("weight", np.ones((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(QuantizeError, match="unknown model architecture: 'alien'"):
        quantize_model(store, path, "alien:q8_0", "q8_0")


def test_cancel_kills_the_child(
    store: Store, tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "child.pid"
    child = (
        "import os, sys, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "events = os.fdopen(int(sys.argv[-1]), 'w', buffering=1)\n"
        'events.write(\'{"tensor": 1, "of": 2, "name": "token_embd.weight"}\\n\')\n'
        "time.sleep(600)\n"
    )
    monkeypatch.setattr(
        "localllm.store.quantize._child_command", lambda args: [sys.executable, "-c", child]
    )
    cancel = threading.Event()

    def on_progress(event: object) -> None:
        if getattr(event, "completed", 0):
            cancel.set()  # the child is running and has reported a tensor

    with pytest.raises(OperationCancelledError):
        quantize_model(
            store, tiny_gguf, "tiny:q8_0", "q8_0", on_progress=on_progress, cancel=cancel
        )
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not list(store.partial_dir.glob("tmp-*"))


def test_a_split_model_is_quantized_into_one_file(
    store: Store, tiny_gguf: Path, tmp_path: Path, f32_tokens: list[int]
) -> None:
    parts = split_gguf(tiny_gguf, tmp_path / "split", 3)
    with store.transaction("assembling split:f32") as tx:
        layers = [store.import_file(part, MEDIA_MODEL) for part in parts]
        tx.commit(parse_name("split:f32"), assemble_manifest(store, layers))
    entry = quantize_model(store, "split:f32", "split:q8_0", "q8_0")
    model_layers = [layer for layer in entry.manifest.layers if layer.media_type == MEDIA_MODEL]
    assert len(model_layers) == 1
    path = store.blob_path(model_layers[0].digest)
    assert inspect_gguf(path).file_type == "Q8_0"
    assert greedy_tokens(path) == f32_tokens
