"""Looking around the Hugging Face Hub before downloading: search, a repository's quantizations,
and a GGUF file's header read with a Range request.

Everything goes through ``huggingface_hub`` (its shared HTTP session, token and error classes)
with short explicit timeouts (:attr:`Settings.hub_timeout`) and no retries, so a Hub that is
down or a machine without network answers with one line within a few seconds:

* :func:`search_hub` — one ``GET /api/models`` per page (``filter=gguf``, the query, a sort,
  ``expand`` for the fields a result shows), paged with the Hub's own cursor;
* :func:`list_repo` — one ``GET /api/models/<repo>?blobs=true``: every file with its size, the
  Hub's ``gguf`` metadata (parameters, architecture, context length) and its model card data;
  the GGUF files grouped per quantization (:class:`QuantFiles`, split parts summed), the
  ``mmproj`` files apart as the vision part;
* :func:`read_header` — the first bytes of each part of one quantization (a few MB, never the
  weights), parsed by :func:`~localllm.gguf_info.inspect_gguf_header`.

Errors: :class:`~localllm.RemoteNotFoundError` (no such repository; no GGUF in it),
:class:`~localllm.AuthRequiredError` (gated or private: how to log in),
:class:`~localllm.RateLimitedError` (HTTP 429, with when to retry),
:class:`~localllm.NetworkError` (unreachable, timed out, HTTP 5xx).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlparse

from .._exceptions import GGUFError, PullError, RemoteNotFoundError
from ..gguf_info import GGUFInfo, HeaderIncomplete, inspect_gguf_header
from ..settings import Settings
from .checkout import CheckoutFacts, checkout_files
from .gguf_files import DEFAULT_PREFERENCE, HubFile, _candidates, quant_of
from .hub_errors import hub_error, hub_files

__all__ = [
    "HEADER_LIMIT",
    "SORTS",
    "HubModel",
    "QuantFiles",
    "RepoListing",
    "SearchPage",
    "default_quant",
    "list_repo",
    "read_header",
    "search_hub",
]

SORTS = {
    "downloads": "downloads",
    "likes": "likes",
    "updated": "lastModified",
    "trending": "trendingScore",
    "created": "createdAt",
}
"""``localllm search --sort`` values and the Hub's names for them (all descending)."""
HEADER_LIMIT = 8 << 20
"""Most bytes read from the start of a GGUF file for its header (vocabularies of 250k tokens
fit); a longer header falls back to the Hub's metadata."""
_FIRST_READ = 1 << 20
_LATER_PART_READ = 256 << 10
_EXPAND = (
    "downloads",
    "likes",
    "lastModified",
    "gguf",
    "safetensors",
    "gated",
    "pipeline_tag",
    "tags",
)


def _get(settings: Settings, path: str, params: Any, where: str) -> Any:
    """One GET on the Hub's API through huggingface_hub's session: the response."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    url = path if "://" in path else f"{settings.hf_endpoint}{path}"
    try:
        response = get_session().get(
            url, params=params, headers=build_hf_headers(), timeout=settings.hub_timeout
        )
        hf_raise_for_status(response)
    except Exception as exc:
        raise hub_error(exc, where, settings.hf_endpoint) from None
    return response


# -- search -------------------------------------------------------------------------------------


def _when(value: Any) -> str | None:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value) if value else None


def _parameters(gguf: Any, safetensors: Any) -> int | None:
    if isinstance(gguf, dict) and isinstance(gguf.get("total"), int):
        return int(gguf["total"])
    total = getattr(safetensors, "total", None)
    if total is None and isinstance(safetensors, dict):
        total = safetensors.get("total")
    return int(total) if isinstance(total, int) else None


@dataclass(frozen=True)
class HubModel:
    """One search result: a repository and what the Hub says about it."""

    repo_id: str
    """``user/repo``."""
    downloads: int | None = None
    """Downloads over the last 30 days."""
    likes: int | None = None
    """Likes."""
    last_modified: str | None = None
    """Last update (RFC 3339)."""
    parameters: int | None = None
    """Parameter count, when the Hub read it from a GGUF (or safetensors) file."""
    architecture: str | None = None
    """``llama``, ``qwen2``... (the GGUF's ``general.architecture``)."""
    context_length: int | None = None
    """Trained context length from the GGUF."""
    gated: bool = False
    """Downloads need accepted conditions and a token."""

    @property
    def name(self) -> str:
        """``hf.co/user/repo``: the name to pull or show."""
        return f"hf.co/{self.repo_id}"

    @classmethod
    def from_info(cls, info: Any) -> HubModel:
        """From a ``huggingface_hub.ModelInfo``."""
        gguf = info.gguf if isinstance(info.gguf, dict) else {}
        context = gguf.get("context_length")
        architecture = gguf.get("architecture")
        return cls(
            repo_id=str(info.id),
            downloads=info.downloads,
            likes=info.likes,
            last_modified=_when(info.last_modified),
            parameters=_parameters(gguf, info.safetensors),
            architecture=architecture if isinstance(architecture, str) else None,
            context_length=context if isinstance(context, int) else None,
            gated=bool(info.gated),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``GET /api/search``)."""
        return {
            "name": self.name,
            "repo_id": self.repo_id,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified,
            "parameters": self.parameters,
            "architecture": self.architecture,
            "context_length": self.context_length,
            "gated": self.gated,
        }


@dataclass(frozen=True)
class SearchPage:
    """One page of results and how to get the next."""

    models: list[HubModel]
    """Results, in the order asked for."""
    next_cursor: str | None
    """Pass as ``cursor`` for the next page (None: this is the last)."""


def search_hub(
    settings: Settings,
    query: str,
    *,
    sort: str = "downloads",
    limit: int = 20,
    cursor: str | None = None,
) -> SearchPage:
    """GGUF repositories on the Hub whose name contains ``query``, ``limit`` at a time, by
    ``sort`` (a key of :data:`SORTS`, descending): one Hub request per page."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
    from huggingface_hub import ModelInfo

    params: list[tuple[str, Any]] = [
        ("filter", "gguf"),
        ("sort", SORTS[sort]),
        ("direction", "-1"),
        ("limit", str(limit)),
    ]
    if query:
        params.append(("search", query))
    params += [("expand[]", key) for key in _EXPAND]
    if cursor:
        params.append(("cursor", cursor))
    response = _get(settings, "/api/models", params, "the Hub's search")
    try:
        items = response.json()
        models = [HubModel.from_info(ModelInfo(**item)) for item in items]
    except (ValueError, TypeError, KeyError) as exc:
        raise PullError(f"Hugging Face's search answered something unexpected ({exc})") from None
    link = response.links.get("next", {}).get("url")
    following = parse_qs(urlparse(link).query).get("cursor", [None])[0] if link else None
    return SearchPage(models, following)


# -- one repository -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantFiles:
    """One quantization of a repository: a GGUF file, or every part of a split one."""

    label: str
    """``Q4_K_M``, or the file name when it names no quantization."""
    files: tuple[HubFile, ...]
    """Its file, or its parts in order."""
    projector: HubFile | None = None
    """The vision projector (``mmproj``) that would be pulled with it."""
    converted_size: int | None = None
    """For a safetensors repository: the estimated bytes of the model once converted and
    quantized here (its :attr:`files` are then the checkout downloaded for it)."""

    @property
    def size(self) -> int:
        """Bytes of the model's files (the projector apart); of the converted model, for a
        safetensors repository."""
        if self.converted_size is not None:
            return self.converted_size
        return sum(f.size for f in self.files)

    @property
    def download_size(self) -> int:
        """Bytes downloaded to have it."""
        return sum(f.size for f in self.files)

    @property
    def quant(self) -> str | None:
        """The quantization the file name says (a converted one's label), if any."""
        if self.converted_size is not None:
            return self.label
        return quant_of(self.files[0].path)

    @property
    def tag(self) -> str:
        """What to put after ``hf.co/user/repo:`` to pull exactly this."""
        return self.label if self.quant else self.files[0].path.rsplit("/", 1)[-1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        shown = {
            "label": self.label,
            "tag": self.tag,
            "files": [f.path for f in self.files],
            "size": self.size,
            "split": len(self.files) > 1 and self.converted_size is None,
            "projector": None
            if self.projector is None
            else {"path": self.projector.path, "size": self.projector.size},
        }
        if self.converted_size is not None:
            shown["converted_from"] = "safetensors"
            shown["download_size"] = self.download_size
        return shown


@dataclass(frozen=True)
class RepoListing:
    """A repository's GGUF quantizations and what the Hub says about the model."""

    repo_id: str
    """``user/repo``."""
    revision: str
    """The commit the file list is from."""
    quants: list[QuantFiles]
    """Every quantization, smallest first."""
    projectors: list[HubFile]
    """Every ``mmproj`` file (the vision part)."""
    model: HubModel
    """Downloads, likes, parameters, architecture, context length..."""
    card: dict[str, Any] = field(default_factory=dict)
    """The model card's data the Hub reports (``base_model``, ``license``...)."""
    checkout: CheckoutFacts | None = None
    """For a repository of safetensors (no GGUF): its config; :attr:`quants` are then what
    it would be converted and quantized to here."""

    def find(self, tag: str) -> QuantFiles:
        """The quantization a tag (``Q8_0``, ``q4_k_m``, a file name) means."""
        wanted = tag.upper()
        for quant in self.quants:
            names = [f.path.rsplit("/", 1)[-1] for f in quant.files]
            if wanted in (quant.label.upper(), quant.tag.upper()) or tag in names:
                return quant
        available = ", ".join(q.label for q in self.quants)
        raise RemoteNotFoundError(
            f"hf.co/{self.repo_id} has no {tag} quantization; available: {available}"
        )


def _projector_for(quant: QuantFiles, projectors: Sequence[HubFile]) -> HubFile | None:
    from .gguf_files import GGUFChoice, choose_projector

    chosen = choose_projector(projectors, GGUFChoice(quant.files, quant.quant, ""))
    return chosen[0] if chosen else None


def _card(info: Any) -> dict[str, Any]:
    card = info.card_data
    if card is None:
        return {}
    data = card.to_dict() if hasattr(card, "to_dict") else dict(card)
    keep = ("base_model", "license", "language", "pipeline_tag", "tags")
    return {k: data[k] for k in keep if data.get(k) is not None}


def list_repo(settings: Settings, repo_id: str) -> RepoListing:
    """The GGUF files of ``hf.co/<repo_id>`` grouped per quantization (one Hub request).

    Raises :class:`RemoteNotFoundError` when the repository holds no GGUF model file.
    """
    from huggingface_hub import HfApi

    where = f"hf.co/{repo_id}"
    try:
        info = HfApi(endpoint=settings.hf_endpoint).model_info(
            repo_id, files_metadata=True, timeout=settings.hub_timeout
        )
    except Exception as exc:
        raise hub_error(exc, where, settings.hf_endpoint) from None
    files = hub_files(info)
    projectors = [
        f
        for f in files
        if f.path.lower().endswith(".gguf") and "mmproj" in f.path.rsplit("/", 1)[-1].lower()
    ]
    quants = [
        QuantFiles(candidate.label, candidate.files)
        for candidate in _candidates(files)  # raises for an incomplete split model
    ]
    if not quants and (checkout := checkout_files(files, repo_id)) is not None:
        return _checkout_listing(settings, info, files, checkout)
    if not quants:
        raise RemoteNotFoundError(
            f"{where} has no GGUF model files; localllm runs GGUF models only (look for a "
            "repository with GGUF in its name: localllm search NAME)"
        )
    quants = sorted(
        (QuantFiles(q.label, q.files, _projector_for(q, projectors)) for q in quants),
        key=lambda q: (q.size, q.label),
    )
    return RepoListing(
        repo_id=str(info.id),
        revision=info.sha or "main",
        quants=quants,
        projectors=projectors,
        model=HubModel.from_info(info),
        card=_card(info),
    )


def _checkout_listing(
    settings: Settings, info: Any, files: list[HubFile], checkout: list[HubFile]
) -> RepoListing:
    """A safetensors repository listed as what it would become here: one entry per
    quantization, its size from the config (the converted header's tensors, plus the
    tokenizer file's size for the vocabulary in the GGUF's metadata)."""
    from .checkout import CONVERTED_QUANTS, check_convertible, read_config
    from .checkout_header import checkout_header

    repo_id, revision = str(info.id), info.sha or "main"

    def get_json(path: str) -> Any:
        where = f"hf.co/{repo_id}/{path}"
        response = _get(settings, f"/{repo_id}/resolve/{revision}/{path}", None, where)
        try:
            return response.json()
        except ValueError:
            raise PullError(f"{where} is not JSON") from None

    facts = read_config(get_json, repo_id, files, getattr(info.safetensors, "total", None))
    check_convertible(facts.raw, repo_id)
    # The GGUF's metadata is mostly the vocabulary: about the tokenizer file's size.
    vocabulary = max(
        (f.size for f in checkout if f.path in ("tokenizer.json", "tokenizer.model")), default=0
    )
    quants = []
    for label in CONVERTED_QUANTS:
        try:
            header = checkout_header(facts.config, facts.architecture, label)
            size = sum(t.n_bytes for t in header.tensors)
        except GGUFError:
            from ..store.quantize import estimate_quantized_size

            size = estimate_quantized_size(facts.parameters, label)
        quants.append(QuantFiles(label, tuple(checkout), converted_size=size + vocabulary))
    model = HubModel.from_info(info)
    context = facts.config.get("max_position_embeddings")
    model = dataclasses.replace(
        model,
        parameters=model.parameters or facts.parameters,
        architecture=model.architecture or facts.architecture,
        context_length=model.context_length or (context if isinstance(context, int) else None),
    )
    return RepoListing(
        repo_id=repo_id,
        revision=revision,
        quants=sorted(quants, key=lambda q: (q.size, q.label)),
        projectors=[],
        model=model,
        card=_card(info),
        checkout=facts,
    )


def default_quant(listing: RepoListing) -> QuantFiles:
    """The quantization a pull without a tag takes when no plan decides: Q4_K_M, or the
    nearest in :data:`~.gguf_files.DEFAULT_PREFERENCE` (the header read first is this one's)."""

    def rank(quant: QuantFiles) -> int:
        label = quant.quant
        return DEFAULT_PREFERENCE.index(label) if label in DEFAULT_PREFERENCE else 99

    return min(listing.quants, key=rank)


# -- a GGUF header ------------------------------------------------------------------------------


def _ranges(limit: int, first: int) -> Iterator[int]:
    size = first
    while size < limit:
        yield size
        size *= 4
    yield limit


def _read_part(
    settings: Settings, listing: RepoListing, part: HubFile, first: int, limit: int
) -> GGUFInfo:
    import httpx

    from .huggingface import HubFileSource

    source = HubFileSource(
        repo_id=listing.repo_id,
        path=part.path,
        revision=listing.revision,
        endpoint=settings.hf_endpoint,
        timeout=settings.hub_timeout,
    )
    data = b""
    with httpx.Client(timeout=settings.hub_timeout) as client:
        for end in _ranges(min(limit, part.size), first):
            if end <= len(data):
                continue
            try:
                response = source.open(client, len(data), end)
                try:
                    if response.status_code not in (200, 206):
                        raise PullError(
                            f"{source.description}: HTTP {response.status_code} for a range"
                        )
                    chunk = b""
                    for piece in response.iter_bytes():
                        chunk += piece
                        if len(chunk) >= end - len(data):
                            break
                finally:
                    response.close()
            except Exception as exc:
                raise hub_error(exc, f"hf.co/{listing.repo_id}", settings.hf_endpoint) from None
            if response.status_code == 200 and data:
                # a server that ignores ranges sends the file from the start again
                chunk = chunk[len(data) :]
            data += chunk[: end - len(data)]
            try:
                return inspect_gguf_header(data, part.size, part.path.rsplit("/", 1)[-1])
            except HeaderIncomplete:
                continue
    raise GGUFError(f"{part.path}: the header is longer than the {limit >> 20} MiB read for it")


def read_header(
    settings: Settings, listing: RepoListing, quant: QuantFiles, limit: int = HEADER_LIMIT
) -> list[GGUFInfo]:
    """The headers of ``quant``'s parts, from Range requests of their first bytes (1 MiB,
    then more up to ``limit`` while the header goes on). Raises :class:`~localllm.GGUFError`
    for a file that is not GGUF or whose header is longer than ``limit``. For a safetensors
    repository: the header its conversion would have, made from its config (no request)."""
    if listing.checkout is not None:
        from .checkout_header import checkout_header

        facts = listing.checkout
        return [checkout_header(facts.config, facts.architecture, quant.label)]
    return [
        _read_part(settings, listing, part, _FIRST_READ if index == 0 else _LATER_PART_READ, limit)
        for index, part in enumerate(quant.files)
    ]
