"""GPU side of DRIFT: retrieval, bias add and the EMA update, each as a Triton kernel with a
pure-PyTorch reference (`drift_kernels.reference`) that is the ground truth and the CPU path.

Shipped as `drift_kernels`, never as bare `kernels` (a Hugging Face package of that name is
imported by transformers when present).
"""

from drift_kernels.ops import BACKENDS, bias_add, retrieve, update, use_triton
from drift_kernels.reference import Neighbours, support_residual, unit_rows

__all__ = ["BACKENDS", "Neighbours", "bias_add", "retrieve", "support_residual", "unit_rows",
           "update", "use_triton"]
