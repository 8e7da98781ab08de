"""Loopback fakes of the services localllm talks to (Hugging Face Hub, Ollama registry)."""
