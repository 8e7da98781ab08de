"""Images through every API route: a real daemon, the tiny model with the tiny projector
(``tests/support/tiny_mmproj.py``) and the same model without it.

Bad images are refused with a specific 400 before any runner sees them, and the daemon keeps
serving; a model without a projector answers its one sentence on every route; a vision
model's capabilities, details and projector_info come from the projector layer; a Modelfile
or ``/api/create`` takes the projector as a second GGUF. End to end, a request with images
is evaluated with the images' embeddings: its prompt count grows by exactly one image's
tokens per extra image (same run, nothing asserted about the model's text).
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from test_daemon_support import Daemon, running_daemon
from tiny_mmproj import image_tokens, png_bytes, write_tiny_mmproj

from localllm.client import Client

VISION = "tiny:vision"
TEXT = "tiny:text"

pytestmark = pytest.mark.slow


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` and whose pixels are absent: what a
    decompression bomb looks like to a header reader."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


PNG = png_bytes((0, 128, 255))


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny-f32.gguf")


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path, projector: Path
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("vision") / "home"
    with running_daemon(home, num_parallel=1, num_threads=1, context_length=512) as d:
        client = Client(d.settings)
        # Ollama's create: the model and its projector as two uploaded GGUFs in files.
        files = {
            "model.gguf": client.upload_blob(tiny_gguf),
            "mmproj.gguf": client.upload_blob(projector),
        }
        list(client.create(VISION, files=files))
        d.create(TEXT, tiny_gguf)
        yield d


# -- one request per route, with the images given as base64 ---------------------------------


def generate(model: str, images: list[str]) -> tuple[str, dict[str, Any]]:
    return "/api/generate", {
        "model": model,
        "prompt": "Describe.",
        "images": images,
        "stream": False,
        "options": {"num_predict": 1, "temperature": 0},
    }


def chat(model: str, images: list[str]) -> tuple[str, dict[str, Any]]:
    message = {"role": "user", "content": "Describe.", "images": images}
    return "/api/chat", {
        "model": model,
        "messages": [message],
        "stream": False,
        "options": {"num_predict": 1, "temperature": 0},
    }


def openai_chat(model: str, images: list[str]) -> tuple[str, dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{i}"}} for i in images
    ]
    return "/v1/chat/completions", {
        "model": model,
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}],
        "max_tokens": 1,
        "temperature": 0,
    }


def responses(model: str, images: list[str]) -> tuple[str, dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "input_image", "image_url": f"data:image/png;base64,{i}"} for i in images
    ]
    return "/v1/responses", {
        "model": model,
        "input": [
            {"role": "user", "content": [*parts, {"type": "input_text", "text": "Describe."}]}
        ],
        "max_output_tokens": 16,
        "temperature": 0,
    }


def messages(model: str, images: list[str]) -> tuple[str, dict[str, Any]]:
    blocks: list[dict[str, Any]] = [
        {"type": "image", "source": {"type": "base64", "media_type": mime(i), "data": i}}
        for i in images
    ]
    return "/v1/messages", {
        "model": model,
        "messages": [{"role": "user", "content": [*blocks, {"type": "text", "text": "Describe."}]}],
        "max_tokens": 1,
        "temperature": 0,
    }


def mime(image: str) -> str:
    """The media type Anthropic's clients declare: the image's own (JPEG's base64 starts /9j/)."""
    return "image/jpeg" if image.startswith("/9j/") else "image/png"


ROUTES = [generate, chat, openai_chat, responses, messages]


def error_of(response: httpx.Response) -> str:
    body = response.json()
    error = body.get("error")
    return error["message"] if isinstance(error, dict) else str(error)


def still_serving(http: httpx.Client) -> None:
    response = http.get("/api/tags")
    assert response.status_code == 200
    assert {m["name"] for m in response.json()["models"]} >= {VISION, TEXT}


BAD_IMAGES = [
    pytest.param("not base64 at all!", "is not valid base64", id="garbage-base64"),
    pytest.param(b64(b"hello, this is text"), "is not an image", id="not-an-image"),
    pytest.param(
        b64(png_bytes(fmt="WEBP")),
        "image format WEBP is not supported; use PNG or JPEG",
        id="webp",
    ),
    pytest.param(b64(png_header(20000, 20000)), "pixels", id="bomb-20000x20000"),
    pytest.param(b64(png_header(8000, 8000)), "8000x8000 pixels", id="over-40-megapixels"),
    pytest.param("", "is empty", id="empty"),
]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.__name__)
@pytest.mark.parametrize(("image", "message"), BAD_IMAGES)
def test_a_bad_image_is_a_specific_400_on_every_route(
    http: httpx.Client, route: Any, image: str, message: str
) -> None:
    path, body = route(VISION, [image])
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert message in error_of(response)
    still_serving(http)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.__name__)
def test_more_images_than_the_limit_are_refused(http: httpx.Client, route: Any) -> None:
    path, body = route(VISION, [b64(PNG)] * 17)
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert "at most 16 images" in error_of(response)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.__name__)
def test_a_model_without_a_projector_answers_its_one_sentence(
    http: httpx.Client, route: Any
) -> None:
    path, body = route(TEXT, [b64(PNG)])
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert error_of(response) == f"{TEXT} cannot read images: the model has no vision support"


def test_remote_image_urls_are_refused(http: httpx.Client) -> None:
    fetch = "the daemon does not fetch images from the internet"
    url = "https://example.com/cat.png"
    path, body = openai_chat(VISION, [])
    body["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {"url": url}})
    response = http.post(path, json=body)
    assert response.status_code == 400 and fetch in error_of(response)
    assert "send the image inline as a data: URL" in error_of(response)
    path, body = responses(VISION, [])
    body["input"][0]["content"].insert(0, {"type": "input_image", "image_url": url})
    response = http.post(path, json=body)
    assert response.status_code == 400 and fetch in error_of(response)
    path, body = messages(VISION, [])
    body["messages"][0]["content"].insert(
        0, {"type": "image", "source": {"type": "url", "url": url}}
    )
    response = http.post(path, json=body)
    assert response.status_code == 400 and fetch in error_of(response)
    still_serving(http)


def test_images_in_an_openai_assistant_message_are_refused(http: httpx.Client) -> None:
    path, body = openai_chat(VISION, [b64(PNG)])
    body["messages"] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": body["messages"][0]["content"]},
        {"role": "user", "content": "Describe."},
    ]
    response = http.post(path, json=body)
    assert response.status_code == 400
    assert "images are only allowed in user messages, not assistant" in error_of(response)


def test_a_bad_detail_is_named(http: httpx.Client) -> None:
    path, body = openai_chat(VISION, [b64(PNG)])
    body["messages"][0]["content"][0]["image_url"]["detail"] = "ultra"
    response = http.post(path, json=body)
    assert response.status_code == 400 and "detail must be one of auto, low, high" in error_of(
        response
    )


def test_an_anthropic_media_type_must_be_the_images_own(http: httpx.Client) -> None:
    path, body = messages(VISION, [b64(png_bytes(fmt="JPEG"))])
    body["messages"][0]["content"][0]["source"]["media_type"] = "image/png"
    response = http.post(path, json=body)
    assert response.status_code == 400
    assert "source.media_type says image/png but the image is image/jpeg" in error_of(response)


def test_the_official_clients_see_the_400(daemon: Daemon) -> None:
    oll = ollama.Client(host=daemon.url)
    with pytest.raises(ollama.ResponseError) as info:
        oll.generate(model=VISION, prompt="x", images=[b"not an image at all"])
    assert info.value.status_code == 400 and "is not an image" in info.value.error
    oai = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        oai.chat.completions.create(
            model=TEXT,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"},
                        }
                    ],
                }
            ],
        )
    assert "has no vision support" in str(bad.value)
    claude = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model=VISION,
            max_tokens=1,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "!!"},
                        }
                    ],
                }
            ],
        )
    assert "is not valid base64" in str(refused.value)


# -- the store: capabilities, details, projector_info, Modelfile -------------------------------


def test_vision_is_a_capability_only_with_a_projector(http: httpx.Client) -> None:
    vision = http.post("/api/show", json={"model": VISION}).json()
    text = http.post("/api/show", json={"model": TEXT}).json()
    assert "vision" in vision["capabilities"] and "vision" not in text["capabilities"]
    assert vision["details"]["families"] == ["llama", "clip"]
    assert text["details"]["families"] == ["llama"]
    assert vision["projector_info"]["general.architecture"] == "clip"
    assert vision["projector_info"]["clip.vision.patch_size"] == 14
    assert "projector_info" not in text
    lines = vision["modelfile"].splitlines()
    froms = [line for line in lines if line.startswith("FROM ")]
    assert len(froms) == 2 and Path(froms[1].removeprefix("FROM ")).is_file()


def test_a_projector_alone_is_not_a_model(
    http: httpx.Client, daemon: Daemon, projector: Path
) -> None:
    response = http.post("/api/create", json={"model": "only:projector", "from": str(projector)})
    assert response.status_code == 400
    assert "is a vision projector (general.architecture 'clip'), not a model" in error_of(response)
    digest = Client(daemon.settings).upload_blob(projector)
    response = http.post(
        "/api/create", json={"model": "only:projector", "files": {"mmproj.gguf": digest}}
    )
    assert response.status_code == 400
    assert "files hold only a vision projector" in error_of(response)


def test_a_model_from_a_vision_model_keeps_its_projector(
    http: httpx.Client, daemon: Daemon, projector: Path
) -> None:
    response = http.post(
        "/api/create", json={"model": "tiny:vision-copy", "from": VISION, "system": "Be brief."}
    )
    assert response.status_code == 200, response.text
    shown = http.post("/api/show", json={"model": "tiny:vision-copy"}).json()
    assert "vision" in shown["capabilities"]
    # A projector in files next to a model named in from gives a text model vision.
    digest = Client(daemon.settings).upload_blob(projector)
    body = {"model": "tiny:text-plus", "from": TEXT, "files": {"mmproj.gguf": digest}}
    response = http.post("/api/create", json=body)
    assert response.status_code == 200, response.text
    shown = http.post("/api/show", json={"model": "tiny:text-plus"}).json()
    assert "vision" in shown["capabilities"]


# -- end to end: the image is evaluated ------------------------------------------------------


def prompt_count(http: httpx.Client, route: Any, images: list[str]) -> int:
    path, body = route(VISION, images)
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    if path.startswith("/api/"):
        return int(data["prompt_eval_count"])
    usage = data["usage"]
    if "prompt_tokens" in usage:
        return int(usage["prompt_tokens"])
    # Anthropic counts the prefix read from the cache apart from input_tokens.
    return int(usage["input_tokens"]) + int(usage.get("cache_read_input_tokens", 0))


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.__name__)
def test_images_are_evaluated_on_every_route(http: httpx.Client, route: Any) -> None:
    none = prompt_count(http, route, [])
    one = prompt_count(http, route, [b64(PNG)])
    two = prompt_count(http, route, [b64(PNG), b64(png_bytes((9, 9, 9), fmt="JPEG"))])
    assert one > none
    # Two markers side by side: the second image adds exactly one image's embeddings.
    assert two - one == image_tokens()


def test_images_continue_an_earlier_generate(http: httpx.Client) -> None:
    path, body = generate(VISION, [])
    first = http.post(path, json=body).json()
    body["context"] = first["context"]
    plain = http.post(path, json=body)
    assert plain.status_code == 200, plain.text
    body["images"] = [b64(PNG)]
    continued = http.post(path, json=body)
    assert continued.status_code == 200, continued.text
    # the context's tokens, then the new turn with the image's embeddings
    assert continued.json()["prompt_eval_count"] > plain.json()["prompt_eval_count"]
    # the context of an answer about an image cannot be continued: a clear 400, not a guess
    body = {**body, "context": continued.json()["context"], "images": []}
    after = http.post(path, json=body)
    assert after.status_code == 400
    assert "a context with images cannot be continued" in error_of(after)
    still_serving(http)
