"""DRIFT's kernels: retrieval, bias add and the EMA update as Triton kernels (the GPU path) and
in Rust (`drift_kernels.cpu`, the CPU path), each tested against the pure-PyTorch reference
(`drift_kernels.reference`), which is the specification, including `reference.observe`, one
iteration's whole update. The reference also runs where neither kernel applies. On CUDA a draft
step (retrieval + bias add) is one fused op in two launches (`draft_step`, `drift_kernels.step`),
and `warm_up` compiles the kernels before a timed region.

Shipped as `drift_kernels`, never as bare `kernels` (a Hugging Face package of that name is
imported by transformers when present).
"""

from drift_kernels.ops import BACKENDS, bias_add, draft_step, retrieve, update, use_triton, warm_up
from drift_kernels.reference import Neighbours, support_residual, unit_rows

__all__ = ["BACKENDS", "Neighbours", "bias_add", "draft_step", "retrieve", "support_residual", "unit_rows",
           "update", "use_triton", "warm_up"]
