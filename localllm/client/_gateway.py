"""The few calls localllm makes to the gateway that ``localllm gateway`` starts (the Shepherd
Model Gateway's own routes, not a daemon's), over the synchronous transport."""

from __future__ import annotations

import json
from typing import Any

from .._exceptions import APIError, DaemonTimeoutError, DaemonUnavailableError
from ._core import Endpoint, Request, TimedOut, Timeout, TransportError, error_message
from ._sync_transport import SyncTransport

__all__ = ["GatewayClient"]


class GatewayClient:
    """Whether the gateway is ready, and its workers with their health and load.
    ``api_key`` is the gateway's (its ``--api-key``).

    Errors as for :class:`~localllm.client.Client`: :class:`~localllm.DaemonUnavailableError`
    when nothing answers at ``base_url``, :class:`~localllm.DaemonTimeoutError` when it does
    not answer in time, :class:`~localllm.APIError` for an error answer.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._endpoint = Endpoint(None, self.base_url)
        self._transport = SyncTransport(headers)
        self._timeout = Timeout(connect=timeout, read=timeout)

    def close(self) -> None:
        """Close the connections."""
        self._transport.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _get(self, path: str, *, accept: tuple[int, ...] = ()) -> Any:
        try:
            response = self._transport.request(
                self._endpoint, Request.build("GET", path, self._timeout)
            )
            if response.status_code >= 400 and response.status_code not in accept:
                raise APIError(
                    response.status_code, error_message(response.status_code, response.content)
                )
            return response.json()
        except TimedOut as exc:
            raise DaemonTimeoutError(
                f"the gateway at {self.base_url} did not answer in time"
            ) from exc
        except TransportError as exc:
            raise DaemonUnavailableError(
                f"no gateway answers at {self.base_url} ({exc}); "
                "start one with `localllm gateway --worker URL ...`"
            ) from exc
        except json.JSONDecodeError as exc:
            message = f"the gateway at {self.base_url} answered with invalid JSON"
            raise APIError(502, message) from exc

    def readiness(self) -> dict[str, Any]:
        """``GET /readiness``: ``status`` ("ready" once a worker is healthy, else
        "not_ready"), ``healthy_workers``, ``total_workers``."""
        return dict(self._get("/readiness", accept=(503,)))

    def workers(self) -> list[dict[str, Any]]:
        """``GET /workers``: each worker's ``url``, ``is_healthy``, ``status``, ``models``,
        ``load`` (requests the gateway has in flight there) and ``engine_load`` (what the
        worker last reported at ``/v1/loads``)."""
        return list(self._get("/workers").get("workers", []))
