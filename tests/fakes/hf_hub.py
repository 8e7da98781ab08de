"""A loopback Hugging Face Hub: the parts of the Hub API the real ``huggingface_hub`` client uses.

Routes, as huggingface.co answers them:

* ``GET /api/models/<user>/<repo>[/revision/<rev>]`` (``?blobs=true`` adds sizes and LFS
  metadata): model info with ``sha`` (the commit), ``gated``, ``siblings``.
* ``GET /api/models/<user>/<repo>/tree/<rev>[/<path>]``: the file tree, LFS ``oid`` included.
* ``HEAD|GET /<user>/<repo>/resolve/<rev>/<path>``: LFS files answer ``302`` to the CDN with
  ``X-Repo-Commit``, ``ETag`` (the pointer's git oid), ``X-Linked-Etag`` (the sha256) and
  ``X-Linked-Size``; small files are served directly with their git oid as ``ETag``.
* errors with ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``), which ``huggingface_hub`` turns into its exception classes.

The CDN is a second server on another loopback address (127.0.0.2 where it can be bound), so it
is another origin, as on the real Hub: the client must not send it the token. Fault switches
(drop, stall, pause, corrupt) live on the CDN (:class:`~tests.fakes.server.LoopbackServer`).
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from dataclasses import dataclass, field
from urllib.parse import unquote

from .server import LoopbackServer, RequestHandler, bind_host

__all__ = ["FakeCDN", "FakeHub", "HubRepo"]

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

    def is_lfs(self, path: str) -> bool:
        return len(self.files[path]) > _LFS_THRESHOLD or path.endswith(".gguf")


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

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, gated: bool = False) -> HubRepo:
        """Publish a repository."""
        repo = HubRepo(repo_id, dict(files), gated=gated)
        self.repos[repo_id] = repo
        for path, data in repo.files.items():
            if repo.is_lfs(path):
                self.cdn.objects[_sha256(data)] = data
        return repo

    # -- routes ------------------------------------------------------------------------------

    def route(self, handler: RequestHandler) -> None:
        path = unquote(handler.path.split("?", 1)[0])
        query = handler.path.split("?", 1)[1] if "?" in handler.path else ""
        if path.startswith("/api/models/"):
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
        siblings = []
        for path, data in sorted(repo.files.items()):
            sibling: dict[str, object] = {"rfilename": path}
            if blobs:
                # As on the Hub: the blob id is the git object (the LFS pointer for LFS files),
                # the size is the real file's.
                sibling["size"] = len(data)
                sibling["blobId"] = _git_oid(_lfs_pointer(data) if repo.is_lfs(path) else data)
                if repo.is_lfs(path):
                    sibling["lfs"] = {
                        "sha256": _sha256(data),
                        "size": len(data),
                        "pointerSize": len(_lfs_pointer(data)),
                    }
            siblings.append(sibling)
        handler.send_json(
            200,
            {
                "_id": secrets.token_hex(12),
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": repo.sha,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": ["gguf"],
                "library_name": "gguf",
                "siblings": siblings,
                "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z",
            },
        )

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
            handler.send_bytes(200, data, "text/plain", {"ETag": f'"{_git_oid(data)}"', **common})
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
