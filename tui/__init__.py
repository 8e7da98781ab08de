"""localllm's terminal UI (Textual), installed as ``localllm.tui``."""
