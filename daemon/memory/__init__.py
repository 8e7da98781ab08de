"""The memory plan: what a model needs on each device, what is free, and the load measured by
llama.cpp's no-alloc layout."""
