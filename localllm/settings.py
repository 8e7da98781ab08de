"""Settings: the one place that reads ``LOCALLLM_*`` environment variables.

Every setting is a typed field with a default and a description, so this module is its own
documentation (``localllm settings`` could print it; the table in docs/configuration.md is
checked against it).
Nothing else in localllm reads the environment; everything receives a :class:`Settings`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._exceptions import SettingsError

__all__ = [
    "DEFAULT_PORT",
    "KV_CACHE_TYPES",
    "Settings",
    "describe_settings",
    "hook_variables",
    "parse_duration",
    "parse_host",
    "parse_rpc_workers",
]

DEFAULT_PORT = 11435
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
FLASH_ATTENTION_MODES = ("auto", "on", "off")
# AF_UNIX paths are limited to 108 bytes on Linux (104 on macOS); leave room for the NUL.
_MAX_SOCKET_PATH = 100


TEST_HOOK_PREFIX = "LOCALLLM_TEST_"
"""The test suite's hook variables (``LOCALLLM_TEST_FAULT``, ``LOCALLLM_TEST_PAUSE``): no
setting reads them; only the hooks module the test fixtures provide does (see
:mod:`localllm.testhooks`)."""


def _setting(env: str, default: Any, description: str) -> Any:
    return field(default=default, metadata={"env": env, "description": description})


def parse_duration(value: str | int | float) -> float:
    """Parse an Ollama-style duration into seconds.

    Accepts numbers (seconds), Go-style strings such as ``"5m"``, ``"1h30m"``, ``"250ms"`` and
    ``"-1"``; a negative result means "forever".
    """
    if isinstance(value, bool):
        raise SettingsError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = re.fullmatch(r"(-?)((?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+)", text)
    if not match:
        raise SettingsError(
            f"invalid duration {value!r}: use seconds or a duration like 30s, 5m, 1h"
        )
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total = sum(
        float(number) * units[unit]
        for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", match.group(2))
    )
    return -total if match.group(1) else total


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: str) -> int:
    """Bytes from ``"1073741824"``, ``"512M"``, ``"2G"``, ``"1.5GiB"`` (binary units)."""
    text = value.strip().lower().removesuffix("ib").removesuffix("b")
    unit = text[-1:] if text[-1:] in _SIZE_UNITS and text[-1:].isalpha() else ""
    number = text[: len(text) - len(unit)]
    try:
        size = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        raise SettingsError(f"expected a size like 512M or 2G, got {value!r}") from None
    if size < 0 or size != size:
        raise SettingsError(f"a size cannot be negative, got {value!r}")
    return int(size)


def parse_host(value: str) -> tuple[str, int]:
    """Split ``LOCALLLM_HOST`` (``host``, ``host:port``, ``[v6]:port``, ``http://host:port``)."""
    text = value.strip()
    text = re.sub(r"^https?://", "", text).rstrip("/")
    if not text:
        raise SettingsError("LOCALLLM_HOST is empty")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not port_text:
        port = DEFAULT_PORT
    elif port_text.isdigit() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        raise SettingsError(f"LOCALLLM_HOST has an invalid port: {value!r}")
    return host or "127.0.0.1", port


def parse_rpc_workers(value: str, where: str = "LOCALLLM_RPC_WORKERS") -> tuple[str, ...]:
    """The ``host:port`` endpoints of RPC workers in a comma-separated list (empty: none).

    llama.cpp's RPC client splits an endpoint at its first colon and resolves IPv4 only, so
    an IPv6 literal is refused here rather than failing inside the runner.
    """
    endpoints: list[str] = []
    for part in value.split(","):
        text = part.strip()
        if not text:
            continue
        host, _, port_text = text.rpartition(":")
        if not host or ":" in host or host.startswith("["):
            raise SettingsError(
                f"{where}: {text!r} is not host:port (IPv4 address or host name and a port; "
                "llama.cpp's RPC backend does not take IPv6)"
            )
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise SettingsError(f"{where}: {text!r} has an invalid port")
        endpoint = f"{host}:{int(port_text)}"
        if endpoint in endpoints:
            raise SettingsError(f"{where}: {endpoint} is named twice")
        endpoints.append(endpoint)
    return tuple(endpoints)


def _default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("localllm", appauthor=False))


def _default_state_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir("localllm", appauthor=False))


def _private_dir(path: Path) -> bool:
    """Create ``path`` (mode 0700) if needed; True when it is a directory of ours that nobody
    else can enter. In a shared temp dir another user may have made it first: then False."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False  # a symlink, a file, or someone else's: not a place for our socket
        if info.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        return False
    return True


def _writable_place(path: Path) -> bool:
    """Whether ``path`` is, or could be made, a folder this user can write in: its nearest
    existing ancestor is a folder we may write (a read-only file system answers no)."""
    probe = path
    while not os.path.lexists(probe):
        if probe.parent == probe:
            return False
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


def _fallback_runtime_dir() -> Path:
    """The runtime dir when ``XDG_RUNTIME_DIR`` is unset (sudo, cron, some ssh and containers).

    platformdirs would name ``/run/user/<uid>`` and warn (``RuntimeDirWarning``) on every
    command when that does not exist. We pick a private ``localllm-<uid>`` in the temp dir
    instead: local to this machine (unlike a home on NFS, where two machines would share the
    daemon's lock), and the same for every shell of the user. macOS has no XDG runtime dir and
    keeps platformdirs' answer. Only when the temp dir's folder is unusable (taken by another
    user) does the state dir hold the socket.
    """
    if sys.platform == "darwin":
        import platformdirs

        return Path(platformdirs.user_runtime_dir("localllm", appauthor=False))
    import tempfile  # only without XDG_RUNTIME_DIR: not on every command's path

    candidate = Path(tempfile.gettempdir()) / f"localllm-{os.getuid()}"
    if _private_dir(candidate):
        return candidate
    return _default_state_dir() / "run"


@dataclass(frozen=True)
class Settings:
    """Every knob of localllm, read once from the environment by :meth:`from_env`."""

    home: Path | None = _setting(
        "LOCALLLM_HOME",
        None,
        "Data root: models, logs and the socket live under it. Default: the platform's user "
        "data dir (~/.local/share/localllm on Linux).",
    )
    host: str = _setting(
        "LOCALLLM_HOST",
        f"127.0.0.1:{DEFAULT_PORT}",
        "TCP address of the daemon's HTTP endpoint. Clients try the Unix socket first, then "
        "this address (unless LOCALLLM_HOME fixes the socket's place); when this is set, this "
        "address first. A non-loopback address requires LOCALLLM_API_KEY.",
    )
    host_from_env: bool = _setting(
        "", False, "True when LOCALLLM_HOST was set explicitly (clients then try TCP first)."
    )
    xdg_runtime_dir: Path | None = _setting(
        "",
        None,
        "XDG_RUNTIME_DIR as the environment gave it (an absolute path), or None: the socket "
        "then lives in a private folder of the temp dir.",
    )
    num_parallel: int = _setting(
        "LOCALLLM_NUM_PARALLEL", 4, "Parallel request slots per loaded model (n_seq_max)."
    )
    prefill_ahead: int = _setting(
        "LOCALLLM_PREFILL_AHEAD",
        0,
        "KV sequences beyond the slots in which requests waiting for a slot are prefilled and "
        "get their first token while every slot is busy (each costs a slot's KV memory; they "
        "never decode): -1 as many as the slots, 0 none (the default: their KV memory would "
        "be taken from every loaded model whether or not its slots are ever all busy).",
    )
    max_loaded_models: int = _setting(
        "LOCALLLM_MAX_LOADED_MODELS",
        3,
        "Models kept loaded at once; the least recently used idle one is unloaded first.",
    )
    max_queue: int = _setting(
        "LOCALLLM_MAX_QUEUE",
        512,
        "Requests that may wait for a slot; beyond this the daemon answers 503 with Retry-After.",
    )
    keep_alive: float = _setting(
        "LOCALLLM_KEEP_ALIVE",
        300.0,
        "Seconds a model stays loaded after its last request (accepts 5m, 1h); 0 unloads at "
        "once, negative never unloads.",
    )
    context_length: int = _setting(
        "LOCALLLM_CONTEXT_LENGTH",
        0,
        "Context length of each slot, in tokens (a request's num_ctx overrides); 0 lets the "
        "memory plan choose the largest of 4096, 8192, 16384, 32768 and the trained length "
        "that fits with headroom.",
    )
    kv_cache_type: str = _setting(
        "LOCALLLM_KV_CACHE_TYPE", "f16", "KV cache element type: f16, q8_0 or q4_0."
    )
    flash_attention: str = _setting(
        "LOCALLLM_FLASH_ATTENTION",
        "auto",
        "Flash attention: auto, on (1/true) or off (0/false). Quantized KV needs it on or auto.",
    )
    num_threads: int = _setting(
        "LOCALLLM_NUM_THREADS",
        0,
        "The most CPU threads a runner uses; 0 picks the physical core count. The CPU governor "
        "uses fewer while other programs or other models need cores (a request's num_thread "
        "fixes the count instead).",
    )
    governor: bool = _setting(
        "LOCALLLM_GOVERNOR",
        True,
        "The CPU governor: runners change their thread count between steps to what the machine "
        "gives them now, and models working at the same time share the cores (on, or off for "
        "a fixed count).",
    )
    speed_probe: bool = _setting(
        "LOCALLLM_SPEED_PROBE",
        True,
        "Measure this machine's speed (the speed probe: about 10 s in a child process) at "
        "the daemon's first quiet moment when it is not measured yet, so that show and the "
        "TUI predict speeds (on, or off: only localllm doctor measures it).",
    )
    speed_probe_quiet: float = _setting(
        "LOCALLLM_SPEED_PROBE_QUIET",
        0.2,
        "What other programs may use of all cores for the machine to count as quiet enough "
        "for the speed probe, a share from 0.05 to 1 (0.2: 0.4 of a core on 2 cores). Raise it "
        "on a machine that is never quiet (a shared server, a CI runner): the probe then "
        "measures beside other programs, and its figures are below this machine's best.",
    )
    cpu_affinity: bool = _setting(
        "LOCALLLM_CPU_AFFINITY",
        True,
        "While several models work at once, each runner's threads run on CPUs of their own "
        "(on or off).",
    )
    spare_runner: bool = _setting(
        "LOCALLLM_SPARE_RUNNER",
        True,
        "Keep one runner process started ahead, its libraries imported and no model loaded, "
        "so that a load skips starting Python (on, or off: every load starts a new process).",
    )
    origins: tuple[str, ...] = _setting(
        "LOCALLLM_ORIGINS",
        (),
        "Extra CORS origins allowed besides localhost (comma separated, e.g. app://obsidian.md).",
    )
    api_key: str | None = _setting(
        "LOCALLLM_API_KEY",
        None,
        "When set, every route but / needs 'Authorization: Bearer <key>'.",
    )
    registry: str = _setting(
        "LOCALLLM_REGISTRY",
        "https://registry.ollama.ai",
        "Base URL of the Ollama-protocol registry used for plain model names.",
    )
    hf_endpoint: str = _setting(
        "HF_ENDPOINT",
        "https://huggingface.co",
        "Hugging Face Hub used for hf.co/<user>/<repo> names. The same variable huggingface_hub "
        "reads, read here too because huggingface_hub reads it only once, at import.",
    )
    hub_timeout: float = _setting(
        "LOCALLLM_HUB_TIMEOUT",
        5.0,
        "Seconds a Hugging Face search, file list or GGUF header read may take before it fails "
        "with a one-line error (accepts 5s, 1m); pulls use LOCALLLM_PULL_STALL_TIMEOUT.",
    )
    pull_stall_timeout: float = _setting(
        "LOCALLLM_PULL_STALL_TIMEOUT",
        30.0,
        "Seconds a download may go without receiving a byte before the connection is dropped "
        "and the download resumes on a new one (accepts 30s, 1m).",
    )
    pull_retries: int = _setting(
        "LOCALLLM_PULL_RETRIES",
        6,
        "Failed download attempts in a row (no byte gained) before a pull gives up; each retry "
        "waits longer (1 s, doubling, at most 30 s) and resumes where the last one stopped.",
    )
    debug: bool = _setting(
        "LOCALLLM_DEBUG", False, "Verbose logging in the daemon and runner logs."
    )
    speculative: str = _setting(
        "LOCALLLM_SPECULATIVE",
        "auto",
        "Speculative decoding: auto (the draft model when one is configured, else ngram), "
        "ngram (prompt-lookup drafts from the request's own tokens), draft (a draft model; a "
        "request for a model without one is a 400), or off. Drafts are used only while the "
        "measured acceptance makes them pay.",
    )
    draft_model: str | None = _setting(
        "LOCALLLM_DRAFT_MODEL",
        None,
        "A local model that drafts for every model sharing its vocabulary (a Modelfile DRAFT "
        "line or a request's draft_model option overrides); under auto, models with another "
        "vocabulary fall back to ngram.",
    )
    num_draft: int = _setting(
        "LOCALLLM_NUM_DRAFT",
        8,
        "Most draft tokens verified per step and request (a request's num_draft overrides).",
    )
    kv_cache_ram: int = _setting(
        "LOCALLLM_KV_CACHE_RAM",
        1 << 30,
        "Bytes of host RAM per loaded model for idle prompt prefixes' KV state (accepts 512M, "
        "2G); least recently used prefixes move to disk beyond it. 0 turns the tier off.",
    )
    kv_cache_disk: int = _setting(
        "LOCALLLM_KV_CACHE_DISK",
        4 << 30,
        "Bytes of disk for saved prompt prefixes (kvcache/ under the data root), which outlive "
        "runner unloads and daemon restarts; least recently used go first. 0 turns it off.",
    )
    max_image_bytes: int = _setting(
        "LOCALLLM_MAX_IMAGE_BYTES",
        20 << 20,
        "Largest image a request may attach, in bytes of the decoded file (accepts 20M); "
        "larger ones are a 400.",
    )
    max_image_pixels: int = _setting(
        "LOCALLLM_MAX_IMAGE_PIXELS",
        40_000_000,
        "Most pixels (width x height, read from the header before anything decodes the image) "
        "an attached image may have; refuses decompression bombs.",
    )
    max_images: int = _setting(
        "LOCALLLM_MAX_IMAGES",
        16,
        "Most images one request may attach, over all its messages.",
    )
    cpu_repack: str = _setting(
        "LOCALLLM_CPU_REPACK",
        "auto",
        "Weight repacking in llama.cpp's CPU backend (AMX and the CPU_REPACK buffer types): auto "
        "(a probe in a child process decides, once per llama.cpp build and CPU, whether the "
        "build's CPU paths run here; cached), on or off.",
    )
    rpc_workers: tuple[str, ...] = _setting(
        "LOCALLLM_RPC_WORKERS",
        (),
        "RPC workers (`localllm worker` on other machines) that models are split across, as "
        "host:port,... (a Modelfile or request rpc_workers option overrides; empty for none). "
        "The RPC protocol has no authentication: reach workers over SSH tunnels or a VPN.",
    )
    preload: tuple[str, ...] = _setting(
        "LOCALLLM_PRELOAD",
        (),
        "Models loaded when the daemon starts, in order (comma separated), each as its first "
        "request would load it; one that does not fit is logged and skipped.",
    )
    omp_wait_policy: str | None = _setting(
        "OMP_WAIT_POLICY",
        None,
        "OpenMP's own variable, which llama.cpp's CPU threads follow: active (spin while "
        "waiting) or passive (sleep). localllm only reports it (`localllm doctor`); the CPU "
        "governor keeps spinning threads off busy cores instead.",
    )
    gpu_memory: int = _setting(
        "LOCALLLM_GPU_MEMORY",
        0,
        "The most memory the memory plan puts on each GPU (bytes, or 512MiB, 4GiB...), below "
        "what the GPU reports free; 0 uses what is free. Layers that do not fit stay on the "
        "CPU (the plan says how many).",
    )
    vulkan_visible_devices: str | None = _setting(
        "GGML_VK_VISIBLE_DEVICES",
        None,
        "llama.cpp's own variable: the Vulkan devices it may use, by index (0,1). Unset, it "
        "uses discrete and integrated GPUs and skips software devices such as Mesa's "
        "llvmpipe, which `localllm doctor` then lists as skipped. Runners inherit it as is.",
    )
    mcp_config: Path | None = _setting(
        "LOCALLLM_MCP_CONFIG",
        None,
        "The MCP servers file (the mcpServers shape of Claude Desktop, Cursor and LM Studio) "
        "that `localllm run`, the TUI and `localllm mcp` read. Default: mcp.json in the user's "
        "config dir (~/.config/localllm/mcp.json on Linux).",
    )
    mcp_timeout: float = _setting(
        "LOCALLLM_MCP_TIMEOUT",
        60.0,
        "Seconds an MCP server may take to start, and each tool call to answer (accepts 30s, "
        "2m); a server's own start_timeout and timeout in the config file override it. A call "
        "past it ends with an error the model and the user see.",
    )
    mcp_max_result: int = _setting(
        "LOCALLLM_MCP_MAX_RESULT",
        32_000,
        "Most characters of one tool result given to the model (accepts 32K); the rest is cut, "
        "and a note says how much was left out.",
    )
    mcp_max_steps: int = _setting(
        "LOCALLLM_MCP_MAX_STEPS",
        10,
        "Most model steps (answers that may call tools) for one message; at the limit the chat "
        "stops the loop and says so.",
    )
    ollama_models: Path | None = _setting(
        "OLLAMA_MODELS",
        None,
        "Ollama's model store, which `localllm import ollama` reads (Ollama's own variable). "
        "Default: ~/.ollama/models, else the Linux service's /usr/share/ollama/.ollama/models.",
    )

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``environ`` (default ``os.environ``), validating every value."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}

        def get(name: str) -> str | None:
            raw = env.get(name)
            return raw.strip() if raw is not None and raw.strip() != "" else None

        def as_int(name: str, minimum: int) -> int | None:
            raw = get(name)
            if raw is None:
                return None
            try:
                number = int(raw)
            except ValueError:
                raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
            if number < minimum:
                raise SettingsError(f"{name} must be at least {minimum}, got {number}")
            return number

        if (raw := get("LOCALLLM_HOME")) is not None:
            values["home"] = Path(raw).expanduser().resolve()
        if (raw := get("XDG_RUNTIME_DIR")) is not None and os.path.isabs(raw):
            values["xdg_runtime_dir"] = Path(raw)  # the spec: relative paths are ignored
        if (raw := get("LOCALLLM_HOST")) is not None:
            host, port = parse_host(raw)
            values["host"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            values["host_from_env"] = True
        for name, attr, minimum in (
            ("LOCALLLM_NUM_PARALLEL", "num_parallel", 1),
            ("LOCALLLM_PREFILL_AHEAD", "prefill_ahead", -1),
            ("LOCALLLM_MAX_LOADED_MODELS", "max_loaded_models", 1),
            ("LOCALLLM_MAX_QUEUE", "max_queue", 0),
            ("LOCALLLM_CONTEXT_LENGTH", "context_length", 0),
            ("LOCALLLM_NUM_THREADS", "num_threads", 0),
        ):
            if (number := as_int(name, minimum)) is not None:
                values[attr] = number
        if 0 < values.get("context_length", 0) < 64:
            raise SettingsError(
                "LOCALLLM_CONTEXT_LENGTH must be 0 (chosen by memory) or at least 64, "
                f"got {values['context_length']}"
            )
        if (raw := get("LOCALLLM_PRELOAD")) is not None:
            values["preload"] = tuple(n.strip() for n in raw.split(",") if n.strip())
        if (raw := get("LOCALLLM_KEEP_ALIVE")) is not None:
            try:
                values["keep_alive"] = parse_duration(raw)
            except SettingsError as exc:
                raise SettingsError(f"LOCALLLM_KEEP_ALIVE: {exc}") from None
        if (raw := get("LOCALLLM_KV_CACHE_TYPE")) is not None:
            if raw.lower() not in KV_CACHE_TYPES:
                choices = ", ".join(KV_CACHE_TYPES)
                raise SettingsError(f"LOCALLLM_KV_CACHE_TYPE must be one of {choices}, got {raw!r}")
            values["kv_cache_type"] = raw.lower()
        if (raw := get("LOCALLLM_FLASH_ATTENTION")) is not None:
            mode = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(
                raw.lower(), raw.lower()
            )
            if mode not in FLASH_ATTENTION_MODES:
                raise SettingsError(
                    f"LOCALLLM_FLASH_ATTENTION must be auto, on or off, got {raw!r}"
                )
            values["flash_attention"] = mode
        if (raw := get("LOCALLLM_ORIGINS")) is not None:
            values["origins"] = tuple(o.strip() for o in raw.split(",") if o.strip())
        if (raw := get("LOCALLLM_API_KEY")) is not None:
            values["api_key"] = raw
        if (raw := get("LOCALLLM_REGISTRY")) is not None:
            values["registry"] = raw if "://" in raw else f"https://{raw}"
        if (raw := get("HF_ENDPOINT")) is not None:
            values["hf_endpoint"] = raw.rstrip("/")
        for name, attr in (
            ("LOCALLLM_PULL_STALL_TIMEOUT", "pull_stall_timeout"),
            ("LOCALLLM_HUB_TIMEOUT", "hub_timeout"),
        ):
            if (raw := get(name)) is not None:
                try:
                    seconds = parse_duration(raw)
                except SettingsError as exc:
                    raise SettingsError(f"{name}: {exc}") from None
                if seconds <= 0:
                    raise SettingsError(f"{name} must be positive, got {raw!r}")
                values[attr] = seconds
        if (number := as_int("LOCALLLM_PULL_RETRIES", 0)) is not None:
            values["pull_retries"] = number
        if (raw := get("LOCALLLM_DEBUG")) is not None:
            values["debug"] = raw.lower() not in ("0", "false", "no", "off")
        if (raw := get("LOCALLLM_SPECULATIVE")) is not None:
            if raw.lower() not in ("auto", "ngram", "draft", "off"):
                raise SettingsError(
                    f"LOCALLLM_SPECULATIVE must be auto, ngram, draft or off, got {raw!r}"
                )
            values["speculative"] = raw.lower()
        if (raw := get("LOCALLLM_DRAFT_MODEL")) is not None:
            values["draft_model"] = raw.strip() or None
        if (number := as_int("LOCALLLM_NUM_DRAFT", 0)) is not None:
            values["num_draft"] = min(number, 64)
        for name, attr in (
            ("LOCALLLM_KV_CACHE_RAM", "kv_cache_ram"),
            ("LOCALLLM_KV_CACHE_DISK", "kv_cache_disk"),
        ):
            if (raw := get(name)) is not None:
                try:
                    values[attr] = parse_size(raw)
                except SettingsError as exc:
                    raise SettingsError(f"{name}: {exc}") from None
        if (raw := get("LOCALLLM_MAX_IMAGE_BYTES")) is not None:
            try:
                values["max_image_bytes"] = parse_size(raw)
            except SettingsError as exc:
                raise SettingsError(f"LOCALLLM_MAX_IMAGE_BYTES: {exc}") from None
        for name, attr, minimum in (
            ("LOCALLLM_MAX_IMAGE_PIXELS", "max_image_pixels", 1),
            ("LOCALLLM_MAX_IMAGES", "max_images", 0),
        ):
            if (number := as_int(name, minimum)) is not None:
                values[attr] = number
        if (raw := get("LOCALLLM_CPU_REPACK")) is not None:
            mode = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(
                raw.lower(), raw.lower()
            )
            if mode not in ("auto", "on", "off"):
                raise SettingsError(f"LOCALLLM_CPU_REPACK must be auto, on or off, got {raw!r}")
            values["cpu_repack"] = mode
        for name, attr in (
            ("LOCALLLM_GOVERNOR", "governor"),
            ("LOCALLLM_SPEED_PROBE", "speed_probe"),
            ("LOCALLLM_CPU_AFFINITY", "cpu_affinity"),
            ("LOCALLLM_SPARE_RUNNER", "spare_runner"),
        ):
            if (raw := get(name)) is not None:
                switch = {"1": True, "true": True, "on": True, "0": False, "false": False}
                switch["off"] = False
                if raw.lower() not in switch:
                    raise SettingsError(f"{name} must be on or off, got {raw!r}")
                values[attr] = switch[raw.lower()]
        if (raw := get("LOCALLLM_SPEED_PROBE_QUIET")) is not None:
            try:
                share = float(raw)
            except ValueError:
                share = -1.0
            if not 0.05 <= share <= 1.0:
                raise SettingsError(
                    f"LOCALLLM_SPEED_PROBE_QUIET must be a share of the cores from 0.05 to 1, "
                    f"got {raw!r}"
                )
            values["speed_probe_quiet"] = share
        if (raw := get("LOCALLLM_RPC_WORKERS")) is not None:
            values["rpc_workers"] = parse_rpc_workers(raw)
        if (raw := get("OMP_WAIT_POLICY")) is not None:
            values["omp_wait_policy"] = raw
        if (raw := get("LOCALLLM_GPU_MEMORY")) is not None:
            try:
                values["gpu_memory"] = parse_size(raw)
            except SettingsError as exc:
                raise SettingsError(f"LOCALLLM_GPU_MEMORY: {exc}") from None
        if (raw := get("GGML_VK_VISIBLE_DEVICES")) is not None:
            values["vulkan_visible_devices"] = raw
        if (raw := get("LOCALLLM_MCP_CONFIG")) is not None:
            values["mcp_config"] = Path(raw).expanduser()
        if (raw := get("LOCALLLM_MCP_TIMEOUT")) is not None:
            try:
                seconds = parse_duration(raw)
            except SettingsError as exc:
                raise SettingsError(f"LOCALLLM_MCP_TIMEOUT: {exc}") from None
            if seconds <= 0:
                raise SettingsError(f"LOCALLLM_MCP_TIMEOUT must be positive, got {raw!r}")
            values["mcp_timeout"] = seconds
        if (raw := get("LOCALLLM_MCP_MAX_RESULT")) is not None:
            try:
                values["mcp_max_result"] = parse_size(raw)
            except SettingsError as exc:
                raise SettingsError(f"LOCALLLM_MCP_MAX_RESULT: {exc}") from None
            if values["mcp_max_result"] < 100:
                raise SettingsError(f"LOCALLLM_MCP_MAX_RESULT must be at least 100, got {raw!r}")
        if (number := as_int("LOCALLLM_MCP_MAX_STEPS", 1)) is not None:
            values["mcp_max_steps"] = number
        if (raw := get("OLLAMA_MODELS")) is not None:
            values["ollama_models"] = Path(raw).expanduser()
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (used by tests and the daemon's per-run overrides)."""
        return dataclasses.replace(self, **changes)

    # -- derived paths --------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """Root of the model store: ``blobs/``, ``manifests/``, ``partial/`` (Ollama's layout)."""
        return self.home if self.home is not None else _default_data_dir()

    @property
    def kv_cache_dir(self) -> Path:
        """Saved prompt prefixes (KV state), one folder per model and KV layout."""
        return self.data_dir / "kvcache"

    @property
    def cache_dir(self) -> Path:
        """Files that can be made again: the CPU probe's decisions (per llama.cpp build and
        CPU, so shared by every data root of the user)."""
        import platformdirs

        return Path(platformdirs.user_cache_dir("localllm", appauthor=False))

    @property
    def mcp_config_path(self) -> Path:
        """The MCP servers file: :attr:`mcp_config`, else ``mcp.json`` in the user's config dir
        (platformdirs; ``XDG_CONFIG_HOME`` on Linux)."""
        if self.mcp_config is not None:
            return self.mcp_config
        import platformdirs

        return Path(platformdirs.user_config_dir("localllm", appauthor=False)) / "mcp.json"

    @property
    def rpc_cache_dir(self) -> Path:
        """An RPC worker's tensor cache: large weights it received, by hash, so a model loads
        again without sending them over the network."""
        return self.data_dir / "rpc-cache"

    @property
    def log_dir(self) -> Path:
        """Daemon and runner logs: ``<home>/logs`` with ``LOCALLLM_HOME`` (see
        :meth:`_in_home` for a home that cannot be written), else the platform's state dir."""
        return self._in_home("logs") if self.home is not None else _default_state_dir() / "logs"

    def _in_home(self, name: str) -> Path:
        """``<home>/<name>``; where the home cannot be written (a read-only or missing data
        root, whose models the daemon still serves), a private folder for this home in the
        temp dir instead. The daemon and its clients decide alike, so they meet at the same
        socket."""
        assert self.home is not None
        natural = self.home / name
        if _writable_place(natural):
            return natural
        import hashlib  # rarely needed; it loads OpenSSL, on the path of every CLI command

        tag = hashlib.sha256(os.fsencode(self.home)).hexdigest()[:16]
        return _fallback_runtime_dir() / f"home-{tag}" / name

    @property
    def runtime_dir(self) -> Path:
        """Per-user runtime files: the socket and the daemon's lock/pid file.

        ``<home>/run`` with ``LOCALLLM_HOME`` (unless it cannot be written); else
        ``$XDG_RUNTIME_DIR/localllm``; else a private ``localllm-<uid>`` folder in the temp dir.
        Only without ``LOCALLLM_HOME`` does it depend on the environment, which is why clients
        then also try the TCP address.
        """
        if self.home is not None:
            return self._in_home("run")
        if self.xdg_runtime_dir is not None:
            return self.xdg_runtime_dir / "localllm"
        return _fallback_runtime_dir()

    @property
    def socket_path(self) -> Path:
        """The daemon's Unix socket (mode 0600)."""
        return self.runtime_socket("localllm.sock")

    def runtime_socket(self, name: str) -> Path:
        """A Unix socket called ``name`` in the runtime dir (the daemon's, a runner's).

        When that path is too long for ``AF_UNIX`` (deep temporary homes), a short path under
        the system temp dir, unique to the runtime dir, is used instead.
        """
        natural = self.runtime_dir / name
        if len(os.fsencode(natural)) <= _MAX_SOCKET_PATH:
            return natural
        import hashlib  # rarely needed; it loads OpenSSL, on the path of every CLI command

        tag = hashlib.sha256(os.fsencode(self.runtime_dir)).hexdigest()[:16]
        return Path("/tmp") / f"localllm-{os.getuid()}-{tag}-{name}"

    @property
    def ollama_model_dirs(self) -> tuple[Path, ...]:
        """Where to look for Ollama's model store, in order: ``OLLAMA_MODELS`` alone when set,
        else the user's ``~/.ollama/models`` and the Linux service's store."""
        if self.ollama_models is not None:
            return (self.ollama_models,)
        return (Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models"))

    @property
    def bind_host(self) -> str:
        """Host part of :attr:`host`, without brackets."""
        return parse_host(self.host)[0]

    @property
    def bind_port(self) -> int:
        """Port part of :attr:`host`."""
        return parse_host(self.host)[1]

    @property
    def base_url(self) -> str:
        """``http://host:port`` for TCP clients (0.0.0.0 is reached through 127.0.0.1)."""
        host = self.bind_host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return (
            f"http://[{host}]:{self.bind_port}"
            if ":" in host
            else f"http://{host}:{self.bind_port}"
        )


def describe_settings() -> list[tuple[str, str, str]]:
    """(variable, default, description) for every environment-backed setting."""
    rows = []
    for f in dataclasses.fields(Settings):
        env = f.metadata.get("env")
        if not env:
            continue
        default = f.default
        if isinstance(default, tuple):
            default = ",".join(default) or "(none)"
        elif default is None:
            default = "(none)"
        rows.append((env, str(default), f.metadata["description"]))
    return rows


def hook_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test hook variables set in ``environ`` (default ``os.environ``), by name.

    They are no settings: outside the test suite's fixtures nothing reads them, so a user who
    set one (copied from a test, say) is told by ``localllm doctor`` that it does nothing.
    """
    env = os.environ if environ is None else environ
    return {
        name: value
        for name, value in sorted(env.items())
        if name.startswith(TEST_HOOK_PREFIX) and value.strip()
    }
