"""A loopback Hugging Face Hub: the parts of the Hub API the real ``huggingface_hub`` client uses.

Routes, as huggingface.co answers them:

* ``GET /api/models?search=&filter=gguf&sort=&limit=&expand[]=&cursor=``: the search, one page
  per request, the next page's cursor in a ``Link: <...>; rel="next"`` header; with
  ``expand[]`` only the fields asked for (and ``id``).
* ``GET /api/models/<user>/<repo>[/revision/<rev>]`` (``?blobs=true`` adds sizes and LFS
  metadata): model info with ``sha`` (the commit), ``gated``, ``siblings``, ``downloads``,
  ``likes``, ``cardData`` and ``gguf`` (parameters, architecture and context length, read
  from the repository's first GGUF model file as the Hub reads them); for a repository of
  safetensors, ``safetensors`` (parameters per dtype, read from the shards' headers).
* ``GET /api/models/<user>/<repo>/tree/<rev>[/<path>]``: the file tree, LFS ``oid`` included.
* ``HEAD|GET /<user>/<repo>/resolve/<rev>/<path>``: LFS files answer ``302`` to the CDN with
  ``X-Repo-Commit``, ``ETag`` (the pointer's git oid), ``X-Linked-Etag`` (the sha256) and
  ``X-Linked-Size``; small files are served directly with their git oid as ``ETag``.
* errors with ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``), which ``huggingface_hub`` turns into its exception classes.

The CDN is a second server on another loopback address (127.0.0.2 where it can be bound), so it
is another origin, as on the real Hub: the client must not send it the token. Fault switches
(drop, stall, pause, corrupt) live on the CDN (:class:`~tests.fakes.server.LoopbackServer`);
the API's own are :attr:`FakeHub.api_failure` (a status and headers for every API request: a
429 with ``RateLimit`` headers, a 503) and :attr:`FakeHub.api_stall` (accept, never answer).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

from localllm.gguf_info import GGUFError, inspect_gguf_header

from .server import LoopbackServer, RequestHandler, bind_host

__all__ = ["FakeCDN", "FakeHub", "HubRepo"]

# The Hub's sort keys and the fields they sort by here.
_SORTS = {
    "downloads": "downloads",
    "likes": "likes",
    "lastModified": "last_modified",
    "trendingScore": "downloads",
    "createdAt": "last_modified",
}

# Files up to this size are stored in git itself (no LFS), like a README.
_LFS_THRESHOLD = 10 * 1024


@functools.cache
def _sha256(data: bytes) -> str:
    # Cached: the fake answers many requests about the same (possibly 100 MB) files.
    return hashlib.sha256(data).hexdigest()


@functools.cache
def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(data: bytes) -> bytes:
    lines = ["version https://git-lfs.github.com/spec/v1", f"oid sha256:{_sha256(data)}"]
    return "\n".join([*lines, f"size {len(data)}", ""]).encode()


@dataclass
class HubRepo:
    """A model repository: files by path, one commit."""

    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    """When set, downloads need ``Authorization: Bearer <FakeHub.token>``."""
    sha: str = field(default_factory=lambda: secrets.token_hex(20))
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2026-01-01T00:00:00.000Z"
    card: dict[str, Any] | None = None
    """The model card's YAML data (``cardData``)."""
    tampered: dict[str, bytes] = field(default_factory=dict)
    """Files in git (no LFS) served with these bytes instead of those the listing describes
    (a proxy or a disk that changed them on the way)."""

    def is_lfs(self, path: str) -> bool:
        # As the Hub's default .gitattributes: weights always in LFS, whatever their size.
        return len(self.files[path]) > _LFS_THRESHOLD or path.endswith((".gguf", ".safetensors"))

    def safetensors(self) -> dict[str, Any] | None:
        """The Hub's ``safetensors`` summary: parameters per dtype from the shards' headers."""
        counts: dict[str, int] = {}
        for path, data in sorted(self.files.items()):
            if "/" in path or not path.endswith(".safetensors"):
                continue
            try:
                length = int.from_bytes(data[:8], "little")
                header = json.loads(data[8 : 8 + length])
            except ValueError:
                return None
            for name, tensor in header.items():
                if name == "__metadata__" or not isinstance(tensor, dict):
                    continue
                elements = 1
                for dimension in tensor.get("shape", []):
                    elements *= int(dimension)
                counts[tensor["dtype"]] = counts.get(tensor["dtype"], 0) + elements
        return {"parameters": counts, "total": sum(counts.values())} if counts else None

    def gguf(self) -> dict[str, Any] | None:
        """The Hub's ``gguf`` summary: from the first GGUF model file (projectors aside)."""
        for path, data in sorted(self.files.items()):
            name = path.rsplit("/", 1)[-1].lower()
            if not name.endswith(".gguf") or "mmproj" in name:
                continue
            try:
                info = inspect_gguf_header(data, len(data), name)
            except GGUFError:
                return None
            summary: dict[str, Any] = {
                "total": info.parameter_count,
                "architecture": info.architecture,
            }
            if info.context_length is not None:
                summary["context_length"] = info.context_length
            return summary
        return None

    def has_gguf(self) -> bool:
        return any(p.lower().endswith(".gguf") for p in self.files)

    def summary(self, blobs: bool) -> dict[str, Any]:
        """Model info as ``GET /api/models/<repo>`` answers it."""
        siblings = []
        for path, data in sorted(self.files.items()):
            sibling: dict[str, object] = {"rfilename": path}
            if blobs:
                # As on the Hub: the blob id is the git object (the LFS pointer for LFS files),
                # the size is the real file's.
                sibling["size"] = len(data)
                sibling["blobId"] = _git_oid(_lfs_pointer(data) if self.is_lfs(path) else data)
                if self.is_lfs(path):
                    sibling["lfs"] = {
                        "sha256": _sha256(data),
                        "size": len(data),
                        "pointerSize": len(_lfs_pointer(data)),
                    }
            siblings.append(sibling)
        info: dict[str, Any] = {
            "_id": secrets.token_hex(12),
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0],
            "sha": self.sha,
            "private": False,
            "gated": "manual" if self.gated else False,
            "disabled": False,
            "downloads": self.downloads,
            "likes": self.likes,
            "tags": ["gguf"] if self.has_gguf() else [],
            "library_name": "gguf" if self.has_gguf() else None,
            "siblings": siblings,
            "lastModified": self.last_modified,
            "createdAt": "2026-01-01T00:00:00.000Z",
        }
        if self.card is not None:
            info["cardData"] = self.card
        if (gguf := self.gguf()) is not None:
            info["gguf"] = gguf
        if (safetensors := self.safetensors()) is not None:
            info["safetensors"] = safetensors
        return info


class FakeCDN(LoopbackServer):
    """Serves LFS objects by sha256 at ``/repos/<sha256>`` (a signed query string is ignored)."""

    def __init__(self) -> None:
        super().__init__(bind_host("127.0.0.2"))
        self.objects: dict[str, bytes] = {}

    def route(self, handler: RequestHandler) -> None:
        path = handler.path.split("?", 1)[0]
        sha = path.removeprefix("/repos/")
        data = self.objects.get(sha)
        if data is None:
            handler.send_empty(404)
            return
        self.send_file(handler, data, {"ETag": f'"{sha}"'})

    def object_path(self, data: bytes) -> str:
        """The URL path the CDN serves ``data`` under."""
        return f"/repos/{_sha256(data)}"


class FakeHub(LoopbackServer):
    """The Hub API; its :attr:`cdn` starts and stops with it."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1")
        self.cdn = FakeCDN()
        self.companions.append(self.cdn)
        self.repos: dict[str, HubRepo] = {}
        self.token = "hf_" + secrets.token_hex(8)
        self.api_failure: tuple[int, dict[str, str]] | None = None
        """When set, every API request (search, model info, resolve) gets this status and
        these headers."""
        self.api_stall = False
        """When set, API requests are accepted and never answered (until the server stops)."""

    def add_repo(
        self, repo_id: str, files: dict[str, bytes], *, gated: bool = False, **meta: Any
    ) -> HubRepo:
        """Publish a repository (``meta``: downloads, likes, last_modified, card)."""
        repo = HubRepo(repo_id, dict(files), gated=gated, **meta)
        self.repos[repo_id] = repo
        for path, data in repo.files.items():
            if repo.is_lfs(path):
                self.cdn.objects[_sha256(data)] = data
        return repo

    # -- routes ------------------------------------------------------------------------------

    def route(self, handler: RequestHandler) -> None:
        path = unquote(handler.path.split("?", 1)[0])
        query = handler.path.split("?", 1)[1] if "?" in handler.path else ""
        if self.api_stall:
            self.stopped.wait(60)
            handler.close_connection = True
            return
        if self.api_failure is not None:
            status, headers = self.api_failure
            handler.send_json(status, {"error": f"HTTP {status}"}, headers)
            return
        if path == "/api/models":
            self._search(handler, parse_qs(query))
        elif path.startswith("/api/models/"):
            self._api(handler, path.removeprefix("/api/models/"), "blobs=true" in query)
        elif "/resolve/" in path:
            self._resolve(handler, path)
        else:
            handler.send_json(404, {"error": "Not Found"})

    def _repo_or_error(self, handler: RequestHandler, repo_id: str) -> HubRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            # The Hub answers 401 for a missing repository when the request is anonymous.
            handler.send_json(
                401,
                {"error": "Repository not found"},
                {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
            )
        return repo

    def _api(self, handler: RequestHandler, rest: str, blobs: bool) -> None:
        parts = rest.split("/")
        repo = self._repo_or_error(handler, "/".join(parts[:2]))
        if repo is None:
            return
        tail = parts[2:]
        if tail[:1] == ["tree"]:
            self._tree(handler, repo, "/".join(tail[2:]))
            return
        if tail[:1] == ["revision"] and len(tail) >= 2 and tail[1] not in ("main", repo.sha):
            handler.send_json(
                404,
                {"error": "Invalid rev id"},
                {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"},
            )
            return
        handler.send_json(200, repo.summary(blobs))

    def _search(self, handler: RequestHandler, query: dict[str, list[str]]) -> None:
        """``/api/models``: GGUF repositories whose id contains ``search``, sorted, paged."""
        text = query.get("search", [""])[0].lower()
        repos = [
            r
            for r in self.repos.values()
            if text in r.repo_id.lower() and ("gguf" not in query.get("filter", []) or r.has_gguf())
        ]
        key = _SORTS.get(query.get("sort", ["downloads"])[0], "downloads")
        repos.sort(key=lambda r: (getattr(r, key), r.repo_id), reverse=True)
        try:
            limit = int(query.get("limit", ["1000"])[0])
            cursor = query.get("cursor", [""])[0]
            start = int(base64.urlsafe_b64decode(cursor).decode()) if cursor else 0
        except ValueError:
            handler.send_json(400, {"error": "Invalid limit or cursor"})
            return
        page = repos[start : start + limit]
        expand = query.get("expand[]", [])
        items = []
        for repo in page:
            full = repo.summary(blobs=False)
            if expand:
                item = {"_id": full["_id"], "id": full["id"]}
                item |= {k: full[k] for k in expand if k in full}
            else:
                item = {k: full[k] for k in ("_id", "id", "downloads", "likes", "tags")}
            items.append(item)
        headers = {}
        if start + limit < len(repos):
            following = {k: v for k, v in query.items() if k != "cursor"}
            following["cursor"] = [base64.urlsafe_b64encode(str(start + limit).encode()).decode()]
            url = f"{self.url}/api/models?{urlencode(following, doseq=True)}"
            headers["Link"] = f'<{url}>; rel="next"'
        handler.send_json(200, items, headers)

    def _tree(self, handler: RequestHandler, repo: HubRepo, prefix: str) -> None:
        entries = []
        for path, data in sorted(repo.files.items()):
            if prefix and not path.startswith(prefix.rstrip("/") + "/"):
                continue
            entry: dict[str, object] = {"type": "file", "path": path}
            if repo.is_lfs(path):
                pointer = _lfs_pointer(data)
                entry |= {
                    "oid": _git_oid(pointer),
                    "size": len(data),
                    "lfs": {
                        "oid": _sha256(data),
                        "size": len(data),
                        "pointerSize": len(pointer),
                    },
                }
            else:
                entry |= {"oid": _git_oid(data), "size": len(data)}
            entries.append(entry)
        handler.send_json(200, entries)

    def _resolve(self, handler: RequestHandler, path: str) -> None:
        before, _, after = path.lstrip("/").partition("/resolve/")
        repo = self._repo_or_error(handler, before)
        if repo is None:
            return
        revision, _, file_path = after.partition("/")
        common = {"X-Repo-Commit": repo.sha}
        if revision not in ("main", repo.sha):
            handler.send_json(
                404,
                {"error": "Invalid rev id"},
                {"X-Error-Code": "RevisionNotFound", **common},
            )
            return
        data = repo.files.get(file_path)
        if data is None:
            handler.send_json(
                404,
                {"error": "Entry not found"},
                {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found", **common},
            )
            return
        if repo.gated and handler.headers.get("Authorization") != f"Bearer {self.token}":
            message = (
                f"Access to model {repo.repo_id} is restricted. You must have access to it "
                "and be authenticated to access it. Please log in."
            )
            handler.send_json(
                401,
                {"error": message},
                {"X-Error-Code": "GatedRepo", "X-Error-Message": message, **common},
            )
            return
        if not repo.is_lfs(file_path):
            served = repo.tampered.get(file_path, data)
            handler.send_bytes(200, served, "text/plain", {"ETag": f'"{_git_oid(data)}"', **common})
            return
        sha = _sha256(data)
        location = (
            f"{self.cdn.url}{self.cdn.object_path(data)}?X-Amz-Signature={secrets.token_hex(8)}"
        )
        handler.redirect(
            302,
            location,
            {
                "ETag": f'"{_git_oid(_lfs_pointer(data))}"',
                "X-Linked-Etag": f'"{sha}"',
                "X-Linked-Size": str(len(data)),
                **common,
            },
        )
