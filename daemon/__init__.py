"""localllm's daemon: the HTTP service (Ollama and OpenAI APIs), the scheduler and the runners.

Installed as ``localllm.daemon``. It never calls llama.cpp for generation itself: each loaded
model is served by a runner child process (``localllm.daemon.runner``).
"""
