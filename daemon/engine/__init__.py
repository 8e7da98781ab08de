"""The engine: the llama.cpp model and context, slots, the batch of each step, sampling, jobs and
the text they stream."""
