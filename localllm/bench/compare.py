"""``localllm bench --compare KEY=A,B``: one target per value. A request option
(``num_ctx``, ``num_batch``...) is sent with each request to the same daemon; a daemon setting
that only a restart changes (``kv_cache_type``, ``num_parallel``, ``flash_attention``...) gets a
:class:`SpawnedDaemon` per value, sharing the user's model files through a temporary home
(hard links, else symbolic links)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._exceptions import BenchError
from .._process import free_port
from ..client import AsyncClient
from ..settings import Settings
from .drivers import LocalllmDriver
from .run import Target

__all__ = ["SpawnedDaemon", "compare_plan", "compare_targets"]

# Settings that only a daemon restart changes and that --compare may not touch.
_NOT_COMPARABLE = frozenset({"home", "host", "api_key", "origins", "registry", "hf_endpoint"})
_SPAWN_TIMEOUT = 120.0


def _setting_fields() -> dict[str, dataclasses.Field[Any]]:
    return {
        f.name: f
        for f in dataclasses.fields(Settings)
        if f.metadata.get("env") and f.name not in _NOT_COMPARABLE
    }


def _option_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def compare_plan(spec: str) -> tuple[str, str, list[str]]:
    """Parse ``KEY=V1,V2,...``: returns the key, ``option`` (a request option: the same
    daemon, sent with each request) or ``setting`` (a daemon setting: a daemon per value),
    and the values. Raises :class:`BenchError` naming what is wrong."""
    from ..store.models import OPTION_TYPES

    key, sep, values_text = spec.partition("=")
    key = key.strip().lower()
    values = [v.strip() for v in values_text.split(",") if v.strip()]
    if not sep or not key or len(values) < 2:
        raise BenchError(f"--compare wants KEY=VALUE1,VALUE2[,...], got {spec!r}")
    if key in ("speculation", "spec"):
        key = "speculative"
    settings = _setting_fields()
    if key in OPTION_TYPES:
        return key, "option", values
    if key in settings:
        return key, "setting", values
    options = ", ".join(sorted(k for k in OPTION_TYPES if k.startswith("num_")))
    daemon = ", ".join(sorted(settings))
    raise BenchError(
        f"cannot compare {key!r}: request options are {options} (and the sampling options); "
        f"daemon settings (a daemon per value) are {daemon}"
    )


class SpawnedDaemon:
    """A private localllm daemon for one daemon setting, sharing the user's model files.

    Its home is a temporary folder holding the model's manifest and links to its blobs (hard
    links when the temp dir is on the same file system, else symbolic ones), so nothing is
    copied and the user's daemon and store are left alone; it listens on a free loopback
    port. Other ``LOCALLLM_*`` variables of this process are passed on, the setting on top.
    """

    def __init__(self, settings: Settings, model: str, env: Mapping[str, str]) -> None:
        self.settings = settings
        """The user's settings (where the store is)."""
        self.model = model
        """The model to make available."""
        self.env = dict(env)
        """``LOCALLLM_*`` overrides for this daemon."""
        self.process: subprocess.Popen[bytes] | None = None
        """The daemon process once started."""
        self.home: Path | None = None
        """Its temporary home."""
        self.url = ""
        """Its base URL once started."""

    def _make_home(self) -> Path:
        from ..starter import _MARKER
        from ..store.names import parse_name
        from ..store.store import Store

        store = Store(self.settings.data_dir)
        name = parse_name(self.model)
        entry = store.get(name)  # raises ModelNotFoundError with the pull hint
        home = Path(tempfile.mkdtemp(prefix="localllm-bench-"))
        shadow = Store(home)
        shadow.blobs_dir.mkdir(parents=True)
        for digest in entry.manifest.digests:
            source, target = store.blob_path(digest), shadow.blob_path(digest)
            try:
                os.link(source, target)
            except OSError:
                target.symlink_to(source.resolve())
        manifest = shadow.manifest_path(name)
        manifest.parent.mkdir(parents=True)
        shutil.copyfile(store.manifest_path(name), manifest)
        # The starter model would otherwise be imported (copied) into this home at start.
        (home / _MARKER).touch()
        return home

    async def start(self) -> AsyncClient:
        """Start the daemon and wait until it answers; returns a client for it."""
        from ..autostart import _log_tail

        self.home = await asyncio.to_thread(self._make_home)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("LOCALLLM_HOME", "LOCALLLM_HOST")}
        env.update(self.env)
        env["LOCALLLM_HOME"] = str(self.home)
        env["LOCALLLM_HOST"] = f"127.0.0.1:{port}"
        log_path = self.home / "bench-daemon.log"
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "localllm.daemon"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"
        client = AsyncClient(Settings.from_env(env), use_tcp=True)
        deadline = time.monotonic() + _SPAWN_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                await client.close()
                tail = _log_tail(log_path, 0)
                await self.stop()
                raise BenchError(
                    f"the daemon for {self._describe()} exited with status "
                    f"{self.process.returncode}:\n{tail}"
                )
            if await client.is_running():
                return client
            await asyncio.sleep(0.1)
        await client.close()
        await self.stop()
        raise BenchError(f"the daemon for {self._describe()} did not answer in time")

    def _describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env.items())

    async def stop(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL) and remove its home."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        if self.home is not None:
            await asyncio.to_thread(shutil.rmtree, self.home, True)
            self.home = None


async def compare_targets(
    spec: str, settings: Settings, client: AsyncClient, model: str
) -> list[Target]:
    """One :class:`Target` per value of a ``--compare`` spec: request options on the daemon
    of ``client``, daemon settings on a :class:`SpawnedDaemon` each (the daemon must be on
    this machine, which holds the store they share)."""
    key, kind, values = compare_plan(spec)
    targets: list[Target] = []
    if kind == "option":
        for value in values:
            parsed = _option_value(value)
            targets.append(
                Target(
                    label=f"{key}={value}",
                    driver=LocalllmDriver(client),
                    model=model,
                    options={key: parsed},
                    setting={key: parsed},
                )
            )
        return targets
    env_name = _setting_fields()[key].metadata["env"]
    try:
        for value in values:
            daemon = SpawnedDaemon(settings, model, {env_name: value})
            spawned = await daemon.start()
            driver = LocalllmDriver(
                spawned, kv_cache_type=value.lower() if key == "kv_cache_type" else None
            )
            driver.owns_client = True
            if key != "kv_cache_type":
                driver.kv_cache_type = Settings.from_env(
                    {**os.environ, env_name: value}
                ).kv_cache_type
            targets.append(
                Target(
                    label=f"{key}={value}",
                    driver=driver,
                    model=model,
                    setting={key: value},
                    daemon=daemon,
                )
            )
    except BaseException:
        for target in targets:
            await target.driver.close()
            if target.daemon is not None:
                await target.daemon.stop()
        raise
    return targets
