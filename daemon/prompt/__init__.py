"""The prompt: the GGUF's chat template rendered in a sandbox."""
