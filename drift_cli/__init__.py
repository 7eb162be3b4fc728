"""drift-bench: speculative decoding under distribution shift."""

__version__ = "0.1.0"
