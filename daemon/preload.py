"""``LOCALLLM_PRELOAD``: models loaded when the daemon starts, in order, each as its first
request would load it (its Modelfile parameters, the settings, the memory plan). A model that
is missing or does not fit is logged and skipped; the daemon serves meanwhile."""

from __future__ import annotations

import logging

from localllm._exceptions import LocalLLMError

from .errors import HTTPProblem
from .generation import resolve_model
from .loadconfig import runner_config
from .options import merge_options
from .runner.client import RunnerError
from .state import DaemonState

__all__ = ["preload"]

log = logging.getLogger("localllm.daemon")


async def preload(state: DaemonState) -> list[str]:
    """Load the models of ``LOCALLLM_PRELOAD`` one after the other; returns those loaded."""
    loaded: list[str] = []
    for name in state.settings.preload:
        try:
            model = resolve_model(state, name)
            config = runner_config(state.settings, model, merge_options(model, None))
            lease = await state.scheduler.acquire(model, config)
        except (HTTPProblem, LocalLLMError, RunnerError) as exc:
            message = exc.message if isinstance(exc, HTTPProblem) else str(exc)
            log.warning("LOCALLLM_PRELOAD: not loading %s: %s", name, message)
            continue
        except Exception:  # a bug must not end the others' preloading, nor go unseen
            log.exception("LOCALLLM_PRELOAD: loading %s failed", name)
            continue
        lease.release()
        loaded.append(name)
        log.info("LOCALLLM_PRELOAD: loaded %s", name)
    return loaded
