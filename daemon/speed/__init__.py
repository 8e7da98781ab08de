"""Speed: the probe that measures this machine, the model that predicts a model's speed from it,
the book of measured rates, and the watch for a quiet moment."""
