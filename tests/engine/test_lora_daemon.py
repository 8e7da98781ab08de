"""LoRA adapters through the daemon and the CLI: ``ADAPTER`` lines in a Modelfile, ``show``,
two models with different adapters on one base served by one runner (the base loaded once,
counted once), 4 clients each at once answering as each model does alone, the per-request
``adapters`` option (and OpenAI's ``lora``), ``ps`` and ``/metrics``, bad adapters refused."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lora_support import write_lora_gguf
from test_cli_support import CliHome, cli_home
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lora-daemon")
    base = write_tiny_gguf(folder / "base.gguf", never_ends=True)
    return {
        "base": base,
        "a": write_lora_gguf(folder / "a.gguf", base, seed=1, std=0.2),
        "b": write_lora_gguf(folder / "b.gguf", base, seed=2, std=0.2),
        "bent": write_lora_gguf(folder / "bent.gguf", base, wrong_rank_for="blk.1.attn_k.weight"),
        "folder": folder,
    }


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> Iterator[CliHome]:
    # Flash attention off: batches of 4 then compute each stream's numbers exactly as a batch
    # of one does, so a stream's greedy answer does not depend on its neighbours.
    home = tmp_path_factory.mktemp("lora-home") / "home"
    with cli_home(home, LOCALLLM_NUM_PARALLEL="8", LOCALLLM_FLASH_ATTENTION="off") as cli:
        cli.ok("create", "tiny", "--from", str(files["base"]))
        for name, scale in (("a", ""), ("b", " 0.5")):
            modelfile = files["folder"] / f"Modelfile.{name}"
            modelfile.write_text(f"FROM tiny\nADAPTER ./{name}.gguf{scale}\n")
            cli.ok("create", f"tiny-{name}", "-f", str(modelfile))
        yield cli


def generate(http: httpx.Client, model: str, **options: Any) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": "lora daemon check: the same prompt for every model",
        "raw": True,
        "stream": False,
        "options": {"temperature": 0, "num_predict": 12, **options},
    }
    response = http.post("/api/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_two_adapter_models_on_one_base_answer_as_each_alone(
    cli: CliHome, files: dict[str, Path]
) -> None:
    shown = cli.ok("show", "tiny-b")
    assert "Adapters" in shown and "scale 0.5, rank 8, 8 weights" in shown
    assert "ADAPTER " in cli.ok("show", "tiny-b", "--modelfile")
    with httpx.Client(base_url=cli.settings.base_url, timeout=120) as http:
        alone = {m: generate(http, m)["response"] for m in ("tiny", "tiny-a", "tiny-b")}
        assert len(set(alone.values())) == 3  # each adapter changes the answer
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            work = [(m, pool.submit(generate, http, m)) for m in ("tiny-a", "tiny-b") * 4]
            answers = [(m, future.result()["response"]) for m, future in work]
        assert all(text == alone[model] for model, text in answers)
        # Per request: choose (none: the base alone) or rescale (b's own 0.5 is its default).
        assert generate(http, "tiny-a", adapters=[])["response"] == alone["tiny"]
        rescaled = generate(http, "tiny-b", adapters=[{"id": 0, "scale": 0.5}])
        assert rescaled["response"] == alone["tiny-b"]
        assert generate(http, "tiny-b", adapters=[{"id": 0, "scale": 1}])["response"] not in (
            alone["tiny-b"],
            alone["tiny"],
        )
        chat = http.post(
            "/v1/completions",
            json={
                "model": "tiny-a",
                "prompt": "lora daemon check: the same prompt for every model",
                "max_tokens": 12,
                "temperature": 0,
                "lora": [],
            },
        )
        assert chat.status_code == 200, chat.text
        bad = http.post(
            "/api/generate",
            json={"model": "tiny-a", "prompt": "x", "options": {"adapters": [{"id": 1}]}},
        )
        assert bad.status_code == 400
        assert (
            bad.json()["error"]
            == "options.adapters[0].id is 1, but tiny-a:latest has adapters 0 to 0"
        )
        ps = {m["name"]: m for m in http.get("/api/ps").json()["models"]}
        metrics = http.get("/metrics").text
    # One runner for the three models: the base loaded once and counted once.
    assert len({m["runner_pid"] for m in ps.values()}) == 1
    owner = ps["tiny:latest"]
    assert owner["runner"]["models"] == ["tiny:latest", "tiny-a:latest", "tiny-b:latest"]
    assert owner["size"] > files["base"].stat().st_size
    for name in ("tiny-a:latest", "tiny-b:latest"):
        (adapter,) = ps[name]["adapters"]
        assert ps[name]["runner"]["loaded_by"] == "tiny:latest"
        assert 0 < adapter["size"] == ps[name]["size"] < files["a"].stat().st_size
    assert ps["tiny-b:latest"]["adapters"][0]["scale"] == 0.5
    assert 'localllm_runner_model{model="tiny-a:latest",runner="tiny:latest"} 1.0' in metrics
    assert 'localllm_adapter_bytes{adapter="' in metrics
    assert "tiny-b:latest LoRA" in cli.ok("ps") and "on the runner of tiny:latest" in cli.ok("ps")


def test_bad_adapters_are_refused_before_anything_is_written(
    cli: CliHome, files: dict[str, Path]
) -> None:
    with httpx.Client(base_url=cli.settings.base_url, timeout=120) as http:
        bent = http.post(
            "/api/create",
            json={"model": "bent", "from": "tiny", "adapters": {"bent.gguf": str(files["bent"])}},
        )
        assert bent.status_code == 400
        message = bent.json()["error"]
        assert "adapter bent.gguf: tensor 'blk.1.attn_k.weight.lora_a' is 257x8" in message
        peft = files["folder"] / "peft"
        peft.mkdir(exist_ok=True)
        (peft / "adapter_config.json").write_text("{}")
        refused = http.post(
            "/api/create",
            json={"model": "peft", "from": "tiny", "adapters": {"peft": str(peft)}},
        )
        assert refused.status_code == 400
        assert "convert_lora_to_gguf.py" in refused.json()["error"]
    modelfile = files["folder"] / "Modelfile.bent"
    modelfile.write_text("FROM tiny\nADAPTER ./bent.gguf\n")
    assert "blk.1.attn_k.weight.lora_a" in cli.fails("create", "bent", "-f", str(modelfile))
    listed = cli.ok("list")
    assert "bent" not in listed and "peft" not in listed
