"""drift-bench: speculative decoding under distribution shift."""

import os

# PyTorch's OpenMP threads sleep when idle instead of spinning (read once, when torch loads its
# libgomp: this must come before torch is imported; a value already set is kept). On the CPU the
# skinny GEMM's own threads run the forward, and an OpenMP worker that spins for milliseconds
# after each small parallel operation (an argmax over the vocabulary, a softmax) takes the core
# they need: on two threads it put a draft step at 1.9 ms against 1.2 (docs/engine.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
