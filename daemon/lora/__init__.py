"""LoRA adapters: the runner's adapter sets and their application per step, and the daemon's
sharing of one base runner among adapters."""
