"""Pure-PyTorch RMSNorm: the one reference that tests and benchmarks compare the kernels against.

Same contract as the kernels: math in float32 (float64 for float64 inputs), output in x's dtype,
rstd in the compute dtype, the weight gradient in the weight's dtype.
"""

from __future__ import annotations

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Differentiable RMSNorm over the last dimension, built from plain torch ops."""
    xf = x.to(compute_dtype(x))
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    return y.to(x.dtype)


def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward op's contract: (y, rstd)."""
    xf = x.to(compute_dtype(x))
    rstd = torch.rsqrt(xf.square().mean(-1) + eps)
    y = xf * rstd.unsqueeze(-1)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    return y.to(x.dtype).contiguous(), rstd.contiguous()


def rms_norm_bwd(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward op's contract: (dx, dw); dw is empty when there is no weight.

    With x_hat = x * rstd and g = grad_y * w:
    dx = rstd * (g - x_hat * mean(x_hat * g)),  dw = sum over rows of grad_y * x_hat.
    """
    ct = compute_dtype(x)
    x_hat = x.to(ct) * rstd.to(ct).unsqueeze(-1)
    dy = grad_y.to(ct)
    g = dy * weight.to(ct) if weight is not None else dy
    dx = rstd.to(ct).unsqueeze(-1) * (g - x_hat * (x_hat * g).mean(-1, keepdim=True))
    if weight is None:
        dw = x.new_empty(0, dtype=torch.float32)
    else:
        dw = (dy * x_hat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return dx.to(x.dtype).contiguous(), dw
