"""``localllm.gateway`` without daemons: worker addresses, the one-line report, model aliases,
the bind rule and the smg arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.gateway import (
    GatewayConfig,
    GatewayError,
    WorkerCheck,
    describe_problems,
    model_aliases,
    parse_worker_url,
    read_worker_file,
    smg_arguments,
)


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("http://10.0.0.2:11435", "http://10.0.0.2:11435"),
        ("10.0.0.2:8000", "http://10.0.0.2:8000"),
        ("gpu-box", "http://gpu-box:11435"),
        ("http://[::1]:9000/", "http://[::1]:9000"),
        ("  https://proxy.example:443 ", "https://proxy.example:443"),
    ],
)
def test_worker_addresses(text: str, url: str) -> None:
    assert parse_worker_url(text) == url


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("ftp://host:21", "use http://host:port"),
        ("http://host:1/v1", "address only"),
        ("http://host:99999", "invalid port"),
        ("http://", "address only"),
    ],
)
def test_bad_worker_addresses(text: str, complaint: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse_worker_url(text)
    assert complaint in str(info.value) and repr(text) in str(info.value)


def test_workers_file(tmp_path: Path) -> None:
    path = tmp_path / "workers"
    path.write_text("# the fleet\nhttp://a:1\n\n  b:2  # second rack\nc\n", encoding="utf-8")
    assert read_worker_file(path) == ["http://a:1", "http://b:2", "http://c:11435"]
    with pytest.raises(GatewayError) as info:
        read_worker_file(tmp_path / "missing")
    assert "missing" in str(info.value)


def test_problems_are_one_line_naming_each_worker() -> None:
    checks = [
        WorkerCheck("http://a:1", "ok", version="0.1.0", models=("tiny:latest",)),
        WorkerCheck("http://b:2", "down", "[Errno 111] Connection refused"),
        WorkerCheck("http://c:3", "foreign", "GET / answered HTTP 200: 'Ollama is running'"),
        WorkerCheck("http://d:4", "refused", "HTTP 401: missing or invalid API key"),
    ]
    line = describe_problems(checks)
    assert line is not None and "\n" not in line
    assert line.startswith("3 of 4 workers not serving: ")
    assert "http://b:2 is down ([Errno 111] Connection refused; it joins when it answers)" in line
    assert "http://c:3 is not localllm (GET / answered HTTP 200: 'Ollama is running'" in line
    assert "http://d:4 refuses the API key" in line
    assert "http://a:1" not in line
    assert describe_problems(checks[:1]) is None
    assert [c.joins for c in checks] == [True, True, False, False]


def test_short_names_are_aliases_of_latest() -> None:
    checks = [
        WorkerCheck("http://a:1", "ok", models=("tiny:latest", "smollm2:135m", "qwen:latest")),
        WorkerCheck("http://b:2", "ok", models=("qwen",)),  # a model really called qwen
        WorkerCheck("http://c:3", "down", models=()),
    ]
    assert model_aliases(checks) == {"tiny": "tiny:latest"}


def test_beyond_loopback_needs_an_api_key() -> None:
    with pytest.raises(GatewayError) as info:
        GatewayConfig(workers=("http://a:1",), host="0.0.0.0")
    assert "--api-key" in str(info.value)
    assert GatewayConfig(workers=("http://a:1",), host="0.0.0.0", api_key="k").url == (
        "http://127.0.0.1:11440"
    )
    assert GatewayConfig(workers=("http://a:1",), host="::1").url == "http://[::1]:11440"
    with pytest.raises(GatewayError):
        GatewayConfig(workers=())
    with pytest.raises(GatewayError):
        GatewayConfig(workers=("http://a:1",), policy="random")


def test_smg_arguments_name_workers_policy_and_aliases_but_never_the_key() -> None:
    config = GatewayConfig(
        workers=("http://a:1", "http://b:2"),
        port=9000,
        policy="round_robin",
        api_key="sekret",
        aliases={"tiny": "tiny:latest"},
        health_interval=3,
    )
    args = smg_arguments(config)
    assert "sekret" not in " ".join(args)
    at = args.index("--worker-urls")
    assert args[at + 1 : at + 3] == ["http://a:1", "http://b:2"]
    assert args[args.index("--policy") + 1] == "round_robin"
    assert args[args.index("--prometheus-host") + 1] == "127.0.0.1"
    assert args[args.index("--prometheus-port") + 1] == "9001"
    assert args[args.index("--health-check-endpoint") + 1] == "/health"
    assert args[args.index("--health-check-interval-secs") + 1] == "3"
    assert args[args.index("--model-alias") + 1] == "tiny=tiny:latest"


def test_smg_parses_the_arguments() -> None:
    """The arguments are ones smg's own launcher accepts (its parser, not a guess)."""
    from smg.launch_router import parse_router_args

    config = GatewayConfig(
        workers=("http://a:1",), port=9000, aliases={"tiny": "tiny:latest"}, load_interval=1
    )
    parsed = parse_router_args(smg_arguments(config))
    assert parsed.worker_urls == ["http://a:1"]
    assert parsed.policy == "cache_aware"
    assert parsed.port == 9000 and parsed.host == "127.0.0.1"
    assert parsed.health_check_endpoint == "/health"
