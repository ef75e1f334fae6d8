"""RMSNorm as a custom PyTorch operator: fused kernels that compose with torch.compile."""

from .nn import RMSNorm
from .ops import rms_norm

__all__ = ["RMSNorm", "rms_norm"]
