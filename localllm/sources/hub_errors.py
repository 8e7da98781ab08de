"""What the Hugging Face Hub's answers mean to localllm: its failures as localllm's errors, its
file list as :class:`~.gguf_files.HubFile` entries. Shared by the pull (:mod:`.huggingface`)
and the look around before one (:mod:`.hub`)."""

from __future__ import annotations

from typing import Any

from .._exceptions import (
    AuthRequiredError,
    NetworkError,
    PullError,
    RateLimitedError,
    RemoteNotFoundError,
)
from .gguf_files import HubFile

__all__ = ["hub_error", "hub_files"]

_LOGIN = "set HF_TOKEN to an access token of that account, or run `huggingface-cli login`"


def _retry_after(headers: Any) -> float | None:
    """Seconds a 429 asks to wait: ``Retry-After`` (seconds), else the IETF ``RateLimit``
    header's reset (as the Hub sends it), parsed by huggingface_hub."""
    value = headers.get("retry-after") if headers is not None else None
    if value and value.strip().isdigit():
        return float(value.strip())
    from huggingface_hub.utils import parse_ratelimit_headers

    info = parse_ratelimit_headers(headers) if headers is not None else None
    return float(info.reset_in_seconds) if info is not None else None


def _status_error(status: int, headers: Any, where: str, endpoint: str) -> Exception:
    if status == 429:
        wait = _retry_after(headers)
        when = f"try again in {wait:.0f} s" if wait is not None else "try again in a minute"
        return RateLimitedError(
            f"Hugging Face is rate-limiting this machine, {when} (HTTP 429; logging in with "
            "HF_TOKEN raises the limit)",
            wait,
        )
    if status in (401, 403):
        return AuthRequiredError(f"{where} needs authentication (HTTP {status}): {_LOGIN}")
    if status >= 500 or status in (408, 425):
        return NetworkError(
            f"Hugging Face at {endpoint} answered HTTP {status}: the Hub is having trouble, "
            "try again later"
        )
    return PullError(f"Hugging Face answered HTTP {status} for {where}")


def hub_error(exc: BaseException, where: str, endpoint: str) -> Exception:
    """The localllm error for what ``huggingface_hub`` (or a download) raised about ``where``."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return AuthRequiredError(
            f"{where} is gated: accept its conditions at {endpoint}/{where.removeprefix('hf.co/')}"
            f", then {_LOGIN}"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return RemoteNotFoundError(
            f"{where} was not found on Hugging Face (check the name; a private repository "
            f"needs a login: {_LOGIN})"
        )
    if isinstance(exc, errors.RevisionNotFoundError | errors.EntryNotFoundError):
        return RemoteNotFoundError(f"{where}: not found on Hugging Face")
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return NetworkError("HF_HUB_OFFLINE is set, so huggingface_hub will not reach the Hub")
    if isinstance(exc, errors.HfHubHTTPError):
        response = getattr(exc, "response", None)
        status = int(getattr(response, "status_code", 0) or 0)
        return _status_error(status, getattr(response, "headers", None), where, endpoint)
    # here, not at the top: the daemon imports this module to start, and httpx comes with .http
    from .http import TransientError, is_transport_error

    if is_transport_error(exc) or isinstance(exc, TransientError):
        return NetworkError(
            f"cannot reach Hugging Face at {endpoint} ({type(exc).__name__}: {exc}); check the "
            "network connection"
        )
    if isinstance(exc, PullError):
        return exc
    return PullError(f"{where}: {type(exc).__name__}: {exc}")


def hub_files(info: Any) -> list[HubFile]:
    """The files of a ``huggingface_hub.ModelInfo`` fetched with ``files_metadata``: real sizes
    (not the LFS pointers') and the LFS sha256 where there is one."""
    return [
        HubFile(
            path=sibling.rfilename,
            size=int(sibling.lfs.size if sibling.lfs else sibling.size or 0),
            sha256=sibling.lfs.sha256 if sibling.lfs else None,
            blob_id=getattr(sibling, "blob_id", None),
        )
        for sibling in info.siblings or []
    ]
