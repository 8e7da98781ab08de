"""Speculative decoding: n-gram and draft-model drafters and the policy that decides when drafting
pays."""
