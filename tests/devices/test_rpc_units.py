"""The parts of RPC support that need no worker: endpoint lists, the layer split, the worker
check against sockets that misbehave, and how ``ps`` prints a split model."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from localllm._exceptions import LocalLLMError, SettingsError
from localllm.cli.ps import device_line, ps_rows
from localllm.daemon.devices.backends import Device
from localllm.daemon.devices.placement import place_layers, split_units
from localllm.daemon.devices.rpc import exposure_warning
from localllm.daemon.devices.workers import expected_protocol, probe
from localllm.daemon.errors import HTTPProblem
from localllm.daemon.loadconfig import runner_config
from localllm.daemon.options import merge_options
from localllm.daemon.runner.protocol import RunnerConfig
from localllm.settings import Settings, parse_rpc_workers
from localllm.store.models import LOAD_OPTIONS, create_model, load_model, parse_parameters
from localllm.store.store import Store

# -- endpoint lists ------------------------------------------------------------------------------


def test_worker_lists_are_normalised_and_bad_entries_named() -> None:
    assert parse_rpc_workers(" 10.0.0.2:50052, box.lan:7000 ,") == (
        "10.0.0.2:50052",
        "box.lan:7000",
    )
    assert parse_rpc_workers("") == ()
    for bad, words in [
        ("10.0.0.2", "not host:port"),
        ("[::1]:50052", "IPv6"),
        ("::1:50052", "IPv6"),
        ("h:0", "invalid port"),
        ("h:70000", "invalid port"),
        ("h:1,h:1", "named twice"),
    ]:
        with pytest.raises(SettingsError, match=words):
            parse_rpc_workers(bad)


def test_the_setting_and_the_load_option() -> None:
    settings = Settings.from_env({"LOCALLLM_RPC_WORKERS": "127.0.0.1:50052,127.0.0.1:50053"})
    assert settings.rpc_workers == ("127.0.0.1:50052", "127.0.0.1:50053")
    with pytest.raises(SettingsError, match="LOCALLLM_RPC_WORKERS"):
        Settings.from_env({"LOCALLLM_RPC_WORKERS": "nope"})
    assert "rpc_workers" in LOAD_OPTIONS
    assert parse_parameters({"rpc_workers": "a:1, b:2"}) == {"rpc_workers": "a:1,b:2"}
    with pytest.raises(LocalLLMError, match="parameter 'rpc_workers'"):
        parse_parameters({"rpc_workers": "a"})


def test_a_request_option_overrides_the_model_and_the_setting(
    store: Store, settings: Settings, tiny_gguf: Path
) -> None:
    create_model(store, "split", gguf_file=tiny_gguf, parameters={"rpc_workers": "10.0.0.2:50052"})
    model = load_model(store, "split")
    configured = replace(settings, rpc_workers=("10.0.0.9:50052",))
    assert runner_config(configured, model, merge_options(model, {})).rpc_workers == [
        "10.0.0.2:50052"
    ]
    none = merge_options(model, {"rpc_workers": ""})  # empty: this machine alone
    assert runner_config(configured, model, none).rpc_workers == []
    assert runner_config(configured, load_model(store, "split"), {}).rpc_workers == [
        "10.0.0.9:50052"
    ]
    for bad in ("10.0.0.2", 5):
        with pytest.raises(HTTPProblem) as raised:
            merge_options(model, {"rpc_workers": bad})
        assert raised.value.param == "options.rpc_workers"


def test_lost_workers_are_not_part_of_a_configs_identity() -> None:
    config = RunnerConfig(model_path="m.gguf", rpc_workers=["a:1", "b:2"])
    assert RunnerConfig(model_path="m.gguf", rpc_workers=["a:1", "b:2"], rpc_lost=["b:2"]) == config
    assert RunnerConfig(model_path="m.gguf", rpc_workers=["a:1"]) != config


# -- the layer split -----------------------------------------------------------------------------


def _device(name: str, kind: str, free: int, endpoint: str | None = None) -> Device:
    return Device(0, name, name, kind, free, free, endpoint)  # type: ignore[arg-type]


def test_split_units_is_proportional_and_whole() -> None:
    assert split_units(6, [1, 1, 1]) == [2, 2, 2]
    assert split_units(5, [1, 1, 1]) == [2, 2, 1]
    assert split_units(33, [24, 8]) == [25, 8]
    assert split_units(4, [0, 0]) == [2, 2]
    assert sum(split_units(81, [3, 5, 7, 11])) == 81


def test_a_cpu_only_machine_shares_layers_with_its_workers_by_free_memory() -> None:
    cpu = _device("CPU", "cpu", 16 << 30)
    workers = [_device("RPC0", "rpc", 32 << 30, "a:1"), _device("RPC1", "rpc", 16 << 30, "b:2")]
    placement = place_layers(31, cpu, workers, -1)
    assert (placement.cpu_units, placement.device_units) == (8, [16, 8])
    assert placement.n_gpu_layers == 24 and placement.local_gpu_layers == 0
    rows = placement.report()
    assert [(r["first_layer"], r["layers"], r["output"]) for r in rows] == [
        (0, 8, False),
        (8, 16, False),
        (24, 7, True),
    ]


def test_with_a_local_gpu_everything_is_offloaded_and_num_gpu_is_honoured() -> None:
    cpu = _device("CPU", "cpu", 64 << 30)
    devices = [_device("RPC0", "rpc", 8 << 30, "a:1"), _device("CUDA0", "gpu", 24 << 30)]
    auto = place_layers(31, cpu, devices, -1)
    assert (auto.cpu_units, auto.device_units, auto.local_gpu_layers) == (0, [8, 24], 24)
    explicit = place_layers(31, cpu, devices, 10)
    assert (explicit.cpu_units, explicit.device_units) == (22, [3, 7])
    assert explicit.report()[0]["output"] is False and explicit.report()[2]["output"] is True


# -- the worker check ----------------------------------------------------------------------------


@contextmanager
def _server(answer: bytes | None) -> Iterator[str]:
    """A loopback server that sends ``answer`` to every connection, or nothing (None)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    done = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(64)
            if answer is not None:
                connection.sendall(answer)
            done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(10)
        listener.close()


def test_a_refused_connection_is_named_with_the_command_to_start_a_worker() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
    port = closed.getsockname()[1]
    with closed:
        status = probe(f"127.0.0.1:{port}", timeout=2)
    assert not status.ok and not status.connected
    assert status.problem is not None
    assert "not answering" in status.problem and f"localllm worker --port {port}" in status.problem


def test_a_worker_that_never_answers_is_reported_busy_not_waited_for() -> None:
    with _server(None) as endpoint:
        status = probe(endpoint, timeout=0.5)
    assert status.problem is not None and "serves one client at a time" in status.problem
    assert status.connected, "up but busy: not a worker that died"


def test_another_protocol_version_and_garbage_are_refused() -> None:
    major, minor = expected_protocol()
    other = struct.pack("<Q", 28) + bytes([major + 1, 0, 0, 0]) + bytes(24)
    with _server(other) as endpoint:
        status = probe(endpoint, timeout=2)
    assert status.version == (major + 1, 0, 0)
    assert status.problem is not None and f"this llama.cpp speaks {major}.{minor}" in status.problem
    with _server(b"HTTP/1.1 400 Bad Request\r\n\r\n") as endpoint:
        status = probe(endpoint, timeout=2)
    assert status.problem is not None and "does not speak ggml's RPC protocol" in status.problem


# -- ps ------------------------------------------------------------------------------------------


def test_ps_prints_the_devices_of_a_split_model() -> None:
    entry = {
        "name": "big:70b",
        "size": 40 << 30,
        "slots": 4,
        "devices": [
            {"name": "CPU", "kind": "cpu", "endpoint": None, "layers": 40, "first_layer": 0},
            {"name": "RPC0", "kind": "rpc", "endpoint": "10.0.0.2:50052", "layers": 1,
             "first_layer": 40},
            {"name": "RPC1", "kind": "rpc", "endpoint": "10.0.0.3:50052", "layers": 39,
             "first_layer": 41, "output": True},
        ],
        "rpc_dropped": ["10.0.0.4:50052"],
    }  # fmt: skip
    line = device_line(entry)
    assert line == (
        "big:70b spans CPU (local): layers 0-39, RPC0 (10.0.0.2:50052): layer 40, "
        "RPC1 (10.0.0.3:50052): layers 41-79 + output; going without lost worker 10.0.0.4:50052"
    )
    table = ps_rows([entry])
    assert "49%/51% local/RPC" in table.splitlines()[1]
    assert table.splitlines()[-1] == line
    assert device_line({"name": "small"}) is None


def test_a_worker_beyond_loopback_warns_that_rpc_has_no_authentication() -> None:
    assert exposure_warning("127.0.0.1", 50052) is None
    warning = exposure_warning("0.0.0.0", 50052)
    assert warning is not None and "no authentication" in warning and "SSH tunnel" in warning
