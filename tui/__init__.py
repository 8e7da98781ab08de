"""localllm's terminal UI (Textual), installed as ``localllm.tui``.

``localllm tui`` runs :func:`localllm.tui.app.main`; :class:`localllm.tui.app.LocalLLMApp` is
the app (chat, models and dashboard screens), talking to the daemon only through
:mod:`localllm.client`.
"""

from __future__ import annotations

__all__: list[str] = []
