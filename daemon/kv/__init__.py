"""The KV cache's tiers: idle prefixes saved from the llama.cpp context to host RAM and disk, and
restored on a prefix hit."""
