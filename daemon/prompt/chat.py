"""What a model's chat template is and says, read once per request into a frozen
:class:`ChatTemplate`: which template the tools' call syntax comes from and which one is
rendered, its tool-call family, its reasoning style, and the Modelfile's conversation parts
(``SYSTEM``, ``MESSAGE``).

The prompt room (:mod:`.plan`) reads it once and hands the value, not the model, to the tools
(:mod:`.tools`), the reasoning switch (:mod:`.thinking`) and the conversation
(:mod:`.history`): none of them looks the template up again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localllm.store.models import LocalModel

from ..toolcalls.core import ToolCallParser
from ..toolcalls.detect import detect_family, grammar_syntax
from ..toolcalls.thinking import ThinkingStyle, thinking_style
from .template import model_template

__all__ = ["ChatTemplate", "chat_template"]


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template for one request, and what it says."""

    model: str
    """The model's short name (what a 400 about its template names)."""
    effective: str | None
    """The Modelfile's Jinja ``TEMPLATE``, else the GGUF's own: its tool syntax counts (a Go
    template cannot be rendered, so the GGUF's is used for those)."""
    rendered: str | None
    """The template the prompt is rendered with: the request's, else the Modelfile's Jinja
    one; None: the runner renders the GGUF's own."""
    family: type[ToolCallParser] | None
    """The tool-call family of :attr:`effective` (None: it renders no tools)."""
    syntax: str | None
    """The call syntax the tools' grammar takes (:func:`grammar_syntax`)."""
    thinking: ThinkingStyle | None
    """How the model reasons with the template the prompt is rendered with (None: it shows
    no reasoning)."""
    system: str | None
    """The Modelfile's ``SYSTEM`` prompt."""
    examples: tuple[dict[str, Any], ...]
    """The Modelfile's ``MESSAGE`` examples, put before the conversation."""

    @property
    def takes_tools(self) -> bool:
        """Whether the template renders the ``tools`` it is given (the ``tools`` capability)."""
        return self.family is not None


def chat_template(model: LocalModel, requested: str | None = None) -> ChatTemplate:
    """Read ``model``'s chat template once; ``requested`` is the request's own Jinja template
    (rendered instead of the model's, and the one whose reasoning style counts)."""
    modelfile = model_template(model)
    effective = modelfile or model.info.chat_template
    rendered = requested or modelfile
    # the reasoning style is read first: it and the call family both ask toolcalls.detect
    # which variables the template reads (cached there)
    thinking = thinking_style(rendered or effective)
    return ChatTemplate(
        model=model.name.short,
        effective=effective,
        rendered=rendered,
        family=detect_family(effective),
        syntax=grammar_syntax(effective),
        thinking=thinking,
        system=model.system,
        examples=tuple(model.messages),
    )
