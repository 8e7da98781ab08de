"""The context a coding tool gets: 64k tokens where the memory plan allows, else the largest
that fits, on a model tag that carries it.

Coding agents send long prompts (their instructions, tools and the files they read): Ollama's
``launch`` tells its users they need 64k tokens. A model trained for fewer
tokens gets the length it was trained for. The daemon's memory plan
(``POST /api/plan``) says whether that fits on this machine with the model's slots, with one
slot, or which shorter context does. A tool's own requests carry no ``num_ctx``, so the
context goes where every request reads it: a model tag whose Modelfile says
``PARAMETER num_ctx`` (created from the model, sharing its blobs: ``qwen3:8b-64k``), unless
the model already says so itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._exceptions import APIError, LaunchError
from ..store.names import parse_name

if TYPE_CHECKING:
    from ..client import Client

__all__ = ["WANTED", "Choice", "choose_context", "context_tag"]

WANTED = 65536
"""The context coding tools want, in tokens."""
SMALLEST = 4096
"""Below this, a coding tool cannot work at all."""


@dataclass
class Choice:
    """What the model is loaded with for the tool."""

    model: str
    """The model (tag) the tool is pointed at."""
    context: int
    """Its context, in tokens."""
    parameters: dict[str, Any]
    """The load parameters the tag sets (``num_ctx``, maybe ``num_parallel``)."""
    notes: list[str] = field(default_factory=list)
    """What the launcher tells the user about the choice."""


def _parameters(text: str) -> dict[str, str]:
    """``/api/show``'s ``parameters`` text (``name value`` lines) as a mapping."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out[key] = value.strip().strip('"')
    return out


def context_tag(model: str, context: int) -> str:
    """The name of ``model`` with ``context`` in its tag (``qwen3:8b`` → ``qwen3:8b-64k``)."""
    name = parse_name(model)
    size = f"{context // 1024}k" if context % 1024 == 0 else str(context)
    if name.is_huggingface:
        return parse_name(f"{name.model.lower()}:{name.tag.lower()}-{size}").short
    return name.with_tag(f"{name.tag}-{size}").short


def _trained(shown: dict[str, Any]) -> int:
    """The context the model was trained for (``<arch>.context_length``; 0: unknown)."""
    for key, value in (shown.get("model_info") or {}).items():
        if key.endswith(".context_length") and isinstance(value, int):
            return value
    return 0


def choose_context(
    client: Client, model: str, say: Callable[[str], None] = lambda _: None
) -> Choice:
    """Plan ``model`` at :data:`WANTED` tokens (or the length it was trained for, when
    shorter), else with one slot, else at the largest context that fits; the tag that
    carries it is created (or reused) and named in the answer."""
    shown = dict(client.show(model))
    notes: list[str] = []
    wanted = WANTED
    trained = _trained(shown)
    if 0 < trained < WANTED:
        wanted = trained
        notes.append(
            f"{model} was trained for {trained} tokens, less than the {WANTED // 1024}k coding "
            f"tools want: its context is {trained}"
        )
    say(f"Planning {model} with a context of {wanted} tokens...")
    options: dict[str, Any] = {"num_ctx": wanted}
    answer = client.plan(model, options)
    if "plan" not in answer:
        nofit = answer.get("nofit") or {}
        refusal = answer.get("refusal", "it does not fit")
        if nofit.get("one_slot"):
            options = {"num_ctx": wanted, "num_parallel": 1}
            answer = client.plan(model, options)
            notes.append(
                f"{wanted} tokens fit only with one slot: requests from the tool wait for "
                "each other"
            )
        elif nofit.get("num_ctx") and int(nofit["num_ctx"]) >= min(SMALLEST, wanted):
            options = {"num_ctx": int(nofit["num_ctx"])}
            answer = client.plan(model, options)
            notes.append(
                f"{wanted} tokens do not fit in this machine's memory ({refusal}); "
                f"{options['num_ctx']} tokens is the largest context that does"
            )
        if "plan" not in answer:
            raise LaunchError(
                f"{model} cannot be loaded with a context a coding tool can use "
                f"({min(SMALLEST, wanted)} tokens or more): {answer.get('refusal', refusal)}"
            )
    plan = answer["plan"]
    notes += [str(w) for w in plan.get("warnings", [])]
    context = int(plan.get("n_ctx_per_slot") or options["num_ctx"])
    parameters = dict(options)
    return Choice(_tag(client, model, shown, context, parameters), context, parameters, notes)


def _tag(
    client: Client, model: str, shown: dict[str, Any], context: int, parameters: dict[str, Any]
) -> str:
    """``model`` itself when its parameters already say so, else the tag carrying them."""
    own = _parameters(shown.get("parameters", ""))
    if all(own.get(k) == str(v) for k, v in parameters.items()):
        return model
    tag = context_tag(model, context)
    try:
        existing: dict[str, str] | None = _parameters(client.show(tag).get("parameters", ""))
    except APIError as exc:
        if exc.status_code != 404:
            raise
        existing = None  # created below
    if existing is not None:
        if all(existing.get(k) == str(v) for k, v in parameters.items()):
            return tag
        # a model of that name that says something else is the user's: not overwritten
        raise LaunchError(
            f"{tag} exists already with other parameters; remove it (localllm rm {tag}) "
            "or name the model to use with --model"
        )
    # the new tag shares the model's blobs and inherits its parameters, these added
    for _ in client.create(tag, from_=model, parameters=dict(parameters)):
        pass
    return tag
