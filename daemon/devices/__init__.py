"""Devices: the CPU (paths probe, thread governor, core budget), GPUs (listing, health, faults),
llama.cpp's backends and placement of layers, and RPC workers."""
