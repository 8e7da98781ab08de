"""The daemon's HTTP routes: :mod:`.ollama` (``/api/*``) and :mod:`.openai` (``/v1/*``)."""
