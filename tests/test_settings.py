"""Settings: one typed object read from LOCALLLM_* variables."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from localllm import SettingsError
from localllm.settings import Settings, describe_settings, parse_duration, parse_host


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.host == "127.0.0.1:11435"
    assert not settings.host_from_env
    assert settings.num_parallel == 4
    assert settings.keep_alive == 300
    assert settings.kv_cache_type == "f16"
    assert settings.flash_attention == "auto"
    assert settings.api_key is None
    assert settings.base_url == "http://127.0.0.1:11435"


def test_environment_is_read_and_normalised(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "LOCALLLM_HOME": str(tmp_path),
            "LOCALLLM_HOST": "http://127.0.0.1:9999/",
            "LOCALLLM_NUM_PARALLEL": "8",
            "LOCALLLM_MAX_LOADED_MODELS": "2",
            "LOCALLLM_MAX_QUEUE": "0",
            "LOCALLLM_KEEP_ALIVE": "1h30m",
            "LOCALLLM_CONTEXT_LENGTH": "8192",
            "LOCALLLM_KV_CACHE_TYPE": "Q8_0",
            "LOCALLLM_FLASH_ATTENTION": "1",
            "LOCALLLM_NUM_THREADS": "2",
            "LOCALLLM_ORIGINS": "app://obsidian.md, http://example.test",
            "LOCALLLM_API_KEY": "secret",
        }
    )
    assert settings.data_dir == tmp_path.resolve()
    assert settings.log_dir == tmp_path.resolve() / "logs"
    assert settings.host == "127.0.0.1:9999" and settings.host_from_env
    assert (settings.num_parallel, settings.max_loaded_models, settings.max_queue) == (8, 2, 0)
    assert settings.keep_alive == 5400
    assert settings.context_length == 8192
    assert settings.kv_cache_type == "q8_0"
    assert settings.flash_attention == "on"
    assert settings.num_threads == 2
    assert settings.origins == ("app://obsidian.md", "http://example.test")
    assert settings.api_key == "secret"


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"LOCALLLM_NUM_PARALLEL": "many"}, "LOCALLLM_NUM_PARALLEL must be an integer"),
        ({"LOCALLLM_NUM_PARALLEL": "0"}, "at least 1"),
        ({"LOCALLLM_KV_CACHE_TYPE": "q2"}, "f16, q8_0, q4_0"),
        ({"LOCALLLM_FLASH_ATTENTION": "maybe"}, "auto, on or off"),
        ({"LOCALLLM_KEEP_ALIVE": "soon"}, "LOCALLLM_KEEP_ALIVE"),
        ({"LOCALLLM_HOST": "127.0.0.1:99999"}, "invalid port"),
        ({"LOCALLLM_SPEED_PROBE_QUIET": "2"}, "share of the cores from 0.05 to 1"),
        ({"LOCALLLM_SPEED_PROBE_QUIET": "quiet"}, "LOCALLLM_SPEED_PROBE_QUIET must be"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    assert fragment in str(info.value)


def test_the_speed_probes_quiet_share() -> None:
    assert Settings.from_env({}).speed_probe_quiet == 0.2
    assert Settings.from_env({"LOCALLLM_SPEED_PROBE_QUIET": "0.5"}).speed_probe_quiet == 0.5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300),
        ("30s", 30),
        ("1h", 3600),
        ("250ms", 0.25),
        ("-1", -1),
        ("-5m", -300),
        (0, 0),
        ("90", 90),
    ],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_hosts() -> None:
    assert parse_host("0.0.0.0") == ("0.0.0.0", 11435)
    assert parse_host("[::1]:8080") == ("::1", 8080)
    assert parse_host(":7000") == ("127.0.0.1", 7000)
    assert Settings.from_env({"LOCALLLM_HOST": "[::1]:8080"}).base_url == "http://[::1]:8080"


def test_socket_path_stays_short_for_deep_homes(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    settings = Settings.from_env({"LOCALLLM_HOME": str(deep)})
    assert len(str(settings.socket_path)) <= 100
    other = Settings.from_env({"LOCALLLM_HOME": str(deep) + "x"})
    assert other.socket_path != settings.socket_path
    shallow = Settings.from_env({"LOCALLLM_HOME": "/tmp/h"})
    assert shallow.socket_path == Path("/tmp/h/run/localllm.sock")


def test_every_setting_is_documented() -> None:
    rows = describe_settings()
    names = {row[0] for row in rows}
    for variable in [
        "LOCALLLM_HOME",
        "LOCALLLM_HOST",
        "LOCALLLM_NUM_PARALLEL",
        "LOCALLLM_MAX_LOADED_MODELS",
        "LOCALLLM_MAX_QUEUE",
        "LOCALLLM_KEEP_ALIVE",
        "LOCALLLM_CONTEXT_LENGTH",
        "LOCALLLM_KV_CACHE_TYPE",
        "LOCALLLM_FLASH_ATTENTION",
        "LOCALLLM_NUM_THREADS",
        "LOCALLLM_ORIGINS",
        "LOCALLLM_API_KEY",
    ]:
        assert variable in names
    assert all(description for _, _, description in rows)


def test_the_hub_timeout_is_a_positive_duration() -> None:
    assert Settings.from_env({}).hub_timeout == 5.0
    assert Settings.from_env({"LOCALLLM_HUB_TIMEOUT": "1.5s"}).hub_timeout == 1.5
    with pytest.raises(SettingsError, match="LOCALLLM_HUB_TIMEOUT must be positive"):
        Settings.from_env({"LOCALLLM_HUB_TIMEOUT": "0"})


# -- the runtime dir (the socket's place) ------------------------------------------------------


def test_runtime_dir_follows_xdg_runtime_dir_unless_a_home_is_set(tmp_path: Path) -> None:
    settings = Settings.from_env({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert settings.runtime_dir == tmp_path / "localllm"
    assert settings.socket_path == tmp_path / "localllm" / "localllm.sock"
    homed = Settings.from_env({"XDG_RUNTIME_DIR": str(tmp_path), "LOCALLLM_HOME": "/tmp/h"})
    assert homed.runtime_dir == Path("/tmp/h/run")
    relative = Settings.from_env({"XDG_RUNTIME_DIR": "run/user"})  # the spec says: ignore it
    assert relative.xdg_runtime_dir is None


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir (tempfile's, as TMPDIR sets it) and the state dir moved under tmp_path."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp"


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS keeps platformdirs' runtime dir")
def test_without_xdg_runtime_dir_a_private_temp_folder_and_no_warning(temp_dir: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # platformdirs' RuntimeDirWarning would fail here
        runtime = Settings.from_env({}).runtime_dir
    assert runtime == temp_dir / f"localllm-{os.getuid()}"
    info = os.lstat(runtime)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()
    os.chmod(runtime, 0o755)  # ours but opened up: closed again
    assert Settings.from_env({}).runtime_dir == runtime
    assert stat.S_IMODE(os.lstat(runtime).st_mode) == 0o700


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS keeps platformdirs' runtime dir")
def test_a_temp_folder_planted_by_someone_else_is_not_used(temp_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (temp_dir / f"localllm-{os.getuid()}").symlink_to(elsewhere)
    runtime = Settings.from_env({}).runtime_dir
    assert runtime == tmp_path / "state" / "localllm" / "run"
