"""What a source resolved a name to: the blobs to fetch and the manifest to write after."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._exceptions import OperationCancelledError
from ..store.manifest import Manifest
from .transfer import BlobSource, fetch_blob

if TYPE_CHECKING:
    from ..settings import Settings
    from ..store.store import Store
    from .progress import ProgressCallback

__all__ = ["PlannedBlob", "PullPlan"]


@dataclass(frozen=True)
class PlannedBlob:
    """One blob to have in the store before the model can be written."""

    digest: str
    """``sha256:<hex>`` the bytes must hash to."""
    size: int
    """Bytes promised by the source."""
    source: BlobSource
    """Where to download it from."""

    def fetch(
        self,
        store: Store,
        settings: Settings,
        on_progress: ProgressCallback | None,
        cancel: threading.Event | None,
    ) -> None:
        """Have the blob in ``store`` (:func:`.transfer.fetch_blob`); a pull cancelled before
        it starts raises :class:`OperationCancelledError` here."""
        if cancel is not None and cancel.is_set():
            raise OperationCancelledError("pull cancelled")
        fetch_blob(
            store,
            self.digest,
            self.size,
            self.source,
            settings=settings,
            on_progress=on_progress,
            cancel=cancel,
        )


@dataclass(frozen=True)
class PullPlan:
    """A resolved pull: fetch :attr:`blobs`, then :attr:`build` the manifest the pull writes."""

    blobs: tuple[PlannedBlob, ...]
    """Every blob of the model, in download order."""
    build: Callable[[], Manifest]
    """The model's manifest, once all blobs exist (it may write small blobs: a config)."""
    file_type: str | None
    """Quantization of the model (``Q4_K_M``, ``F16``...) when the source says, else ``None``."""
    checkout: Mapping[str, str] | None = None
    """For a safetensors repository: its files by name → digest, once all are fetched; the
    pull converts them (:attr:`build` is then not called)."""
    convert_to: str | None = None
    """What the converted checkout is quantized to (``F16``: left as converted)."""

    @property
    def size(self) -> int:
        """Bytes of all blobs."""
        return sum(blob.size for blob in self.blobs)
