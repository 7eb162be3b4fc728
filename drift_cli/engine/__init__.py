"""The speculative decoding engine: one loop for every method."""
