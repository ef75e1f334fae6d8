"""RMSNorm as a custom PyTorch operator: fused kernels that compose with torch.compile."""

from .nn import RMSNorm
from .ops import fused_add_rms_norm, rms_norm

__all__ = ["RMSNorm", "fused_add_rms_norm", "rms_norm"]
