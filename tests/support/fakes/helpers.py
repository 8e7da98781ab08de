"""Helpers for the pull and quantize tests: model bytes, event logs, pulls in child processes."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.settings import Settings
from localllm.sources.progress import PullProgress

__all__ = [
    "PARAMS",
    "ChildPull",
    "EventLog",
    "TinyModels",
    "child_env",
    "registry_config",
    "registry_layers",
]

MEDIA = "application/vnd.ollama.image."
PARAMS = {"temperature": 0.25, "stop": ["<|im_end|>"], "num_ctx": 256}


@dataclass(frozen=True)
class TinyModels:
    """Bytes of the tiny GGUF models the fakes serve."""

    f32: bytes
    f16: bytes
    other: bytes
    """A third valid GGUF (another seed), published under quant labels."""
    split: tuple[bytes, ...]
    """The F32 model split in three parts."""
    f32_path: Path


def registry_layers(gguf: bytes) -> list[tuple[str, bytes]]:
    """Layers of the fake registry's ``tiny`` model: small ones first, the GGUF last."""
    return [
        (MEDIA + "template", b"{{ .System }}{{ .Prompt }}"),
        (MEDIA + "system", b"You are tiny."),
        (MEDIA + "params", json.dumps(PARAMS).encode()),
        (MEDIA + "license", b"MIT"),
        (MEDIA + "model", gguf),
    ]


def registry_config(file_type: str) -> bytes:
    """An Ollama config blob."""
    return json.dumps(
        {"model_format": "gguf", "model_family": "llama", "file_type": file_type}
    ).encode()


class EventLog:
    """Collects progress events (thread-safe); tests can wait for one that matches."""

    def __init__(self) -> None:
        self.events: list[PullProgress] = []
        self._cond = threading.Condition()
        self.seen_digest = threading.Event()
        """Set at the first event about a blob."""

    def __call__(self, event: PullProgress) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()
        if event.digest is not None:
            self.seen_digest.set()

    @property
    def statuses(self) -> list[str]:
        return [e.status for e in self.events]

    def wait_for(self, predicate: Callable[[PullProgress], bool], timeout: float = 60) -> None:
        """Block until an event satisfies ``predicate`` (fails after ``timeout`` seconds)."""
        with self._cond:
            found = self._cond.wait_for(lambda: any(map(predicate, self.events)), timeout)
        assert found, "no such progress event"


class ChildPull:
    """A pull running in another process (``fakes/pull_child.py``); events read as they come."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        script = Path(__file__).with_name("pull_child.py")
        self.process = subprocess.Popen(
            [sys.executable, str(script), name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self._lines.put(json.loads(line))
        self._lines.put(None)

    def wait_for(self, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
        """The first event (JSON object) that satisfies ``predicate``."""
        while True:
            event = self._lines.get(timeout=timeout)
            if event is None:
                stderr = self.process.stderr.read() if self.process.stderr else ""
                raise AssertionError(f"the child pull ended first: {stderr[-2000:]}")
            if predicate(event):
                return event

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """The last event, once the process has exited."""
        last: dict[str, Any] = {}
        while (event := self._lines.get(timeout=timeout)) is not None:
            last = event
        self.process.wait(timeout=timeout)
        return last

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)


def child_env(settings: Settings) -> dict[str, str]:
    """The environment for a child process that sees the same settings."""
    env = dict(os.environ)
    env["LOCALLLM_HOME"] = str(settings.data_dir)
    env["HF_ENDPOINT"] = settings.hf_endpoint
    env["LOCALLLM_REGISTRY"] = settings.registry
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    return env
