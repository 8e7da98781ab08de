"""The model store, one room: what a model is on disk and every way one gets there.

- :mod:`.names` — the name grammar (``[host/][namespace/]model[:tag]``), which no path escapes.
- :mod:`.manifest` — Ollama's manifest and its layers (media types, digests).
- :mod:`.storage` — the one seam every write goes through (atomic writes, fault hooks).
- :mod:`.store` — blobs and manifests: verified, content-addressed, atomic, garbage-collected.
- :mod:`.check` — the store's check (``localllm doctor``, the daemon's start-up).
- :mod:`.modelfile` — the Modelfile grammar.
- :mod:`.models` — models as users see them: create, copy, show, remove.
- :mod:`.quantize` — llama.cpp's quantizer, run in a child process.
- :mod:`.ollama_import` — models taken from an Ollama installation.

Nothing here imports the daemon or the terminal UI; each module is imported by its own name.
"""
