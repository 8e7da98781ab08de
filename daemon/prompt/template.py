"""Chat templates: a model's own (a Modelfile's Jinja ``TEMPLATE``; :mod:`.chat` reads which one
a request uses and what it says), rendered in a sandbox.

Templates come from downloaded files, so they are rendered with Jinja's immutable sandbox
(as llama-cpp-python's ``Jinja2ChatFormatter`` and Hugging Face's tokenizers do): no attribute
access to internals, no mutation of arguments, bounded ``range``. Any failure becomes a
:class:`TemplateRenderError` for that request only.
"""

from __future__ import annotations

import datetime
import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    # (a runner renders templates and has no use for the store's model records)
    from localllm.store.models import LocalModel

__all__ = [
    "TemplateRenderError",
    "compile_template",
    "is_go_template",
    "jinja_override",
    "model_template",
    "render_chat",
]

# A rendered prompt larger than this is a broken or hostile template, not a conversation.
MAX_RENDERED_CHARS = 16 << 20
_GO_TEMPLATE = re.compile(r"\{\{-?\s*(\.|if \.|range \.)")


class TemplateRenderError(ValueError):
    """The chat template failed to render (syntax, a raised exception, a sandbox violation)."""


def is_go_template(template: str) -> bool:
    """Whether ``template`` is written in Go's template language (Ollama's ``TEMPLATE``
    layers: ``{{ .Prompt }}``, ``{{ if .System }}``, ``{{ range .Messages }}``), not Jinja."""
    return _GO_TEMPLATE.search(template) is not None


def jinja_override(text: str | None) -> str | None:
    """``text`` if it is a Jinja template the runner can render, None for Ollama's Go
    templates (``{{ .Prompt }}``)."""
    # Ollama's template layers are Go templates ({{ .Prompt }}); only Jinja can go to the
    # runner, which otherwise renders the GGUF's own chat template.
    if not text or is_go_template(text):
        return None
    return text


def model_template(model: LocalModel) -> str | None:
    """A Modelfile ``TEMPLATE`` written in Jinja, which the runner renders instead of the
    GGUF's chat template; None when the model has none (or only a Go template)."""
    from localllm.store.manifest import MEDIA_TEMPLATE

    layer = model.entry.manifest.layer(MEDIA_TEMPLATE)
    return jinja_override(model.template) if layer is not None else None


def _raise_exception(message: str) -> None:
    raise TemplateRenderError(f"the chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.filters["tojson"] = _tojson
    return environment.from_string(template)


def compile_template(template: str) -> bool:
    """Compile ``template`` ahead of its first render (compiled templates are cached, so the
    render that follows only renders); whether it was compiled now (False: it already was,
    or it does not compile: then :func:`render_chat` meets the same error and reports it)."""
    if is_go_template(template):
        return False
    misses = _compile.cache_info().misses
    try:
        _compile(template)
    except Exception:  # a syntax error, or anything a template's compile raises
        return False
    return _compile.cache_info().misses > misses


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Render ``messages`` with a Jinja chat template, safely; ``extra`` holds further template
    variables (``enable_thinking``...), which never replace the standard ones."""
    if is_go_template(template):
        raise TemplateRenderError(
            "this template uses Go template syntax (Ollama's TEMPLATE); localllm renders Jinja "
            "chat templates like the ones in GGUF files"
        )
    variables = {
        **(extra or {}),
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "tools": tools,
        "date_string": datetime.date.today().strftime("%d %b %Y"),
    }
    try:
        rendered = _compile(template).render(variables)
    except TemplateRenderError:
        raise
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateRenderError(f"the chat template tried something unsafe: {exc}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateRenderError(f"the chat template has a syntax error: {exc}") from None
    except Exception as exc:  # a template can raise anything from its expressions
        raise TemplateRenderError(
            f"the chat template failed: {type(exc).__name__}: {exc}"
        ) from None
    if len(rendered) > MAX_RENDERED_CHARS:
        raise TemplateRenderError("the chat template produced an absurdly large prompt")
    return rendered
