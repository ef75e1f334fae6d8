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


def _normalize_bwd(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx in the compute dtype, and dw (empty when there is no weight).

    With x_hat = x * rstd and g = grad_y * w:
    dx = rstd * (g - x_hat * mean(x_hat * g)),  dw = sum over rows of grad_y * x_hat.
    """
    ct = compute_dtype(x)
    r = rstd.to(ct).unsqueeze(-1)
    x_hat = x.to(ct) * r
    dy = grad_y.to(ct)
    g = dy * weight.to(ct) if weight is not None else dy
    dx = r * (g - x_hat * (x_hat * g).mean(-1, keepdim=True))
    if weight is None:
        dw = x.new_empty(0, dtype=torch.float32)
    else:
        dw = (dy * x_hat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return dx, dw


def rms_norm_bwd(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward op's contract: (dx, dw); dw is empty when there is no weight."""
    dx, dw = _normalize_bwd(grad_y, x, rstd, weight)
    return dx.to(x.dtype).contiguous(), dw


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``h = x + residual`` (stored in residual's dtype), ``y = rms_norm(h)``
    (in x's dtype); returns ``(y, h)``."""
    y, h, _ = fused_add_rms_norm_fwd(x, residual, weight, eps)
    return y, h


def fused_add_rms_norm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused forward op's contract: (y, new_residual, rstd)."""
    wide = torch.float64 in (x.dtype, residual.dtype)
    h = (x.to(torch.float64 if wide else torch.float32) + residual).to(residual.dtype)
    y, rstd = rms_norm_fwd(h, weight, eps)
    return y.to(x.dtype), h.contiguous(), rstd


def fused_add_rms_norm_bwd(
    grad_y: torch.Tensor,
    grad_new_residual: torch.Tensor | None,
    new_residual: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    x_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused backward op's contract: (dx, dresidual, dw). Both x and residual receive the
    gradient of h: the one through y plus the one flowing into new_residual."""
    dh, dw = _normalize_bwd(grad_y, new_residual, rstd, weight)
    if grad_new_residual is not None:
        dh = dh + grad_new_residual.to(dh.dtype)
    # Two tensors, never one aliased twice: an op's outputs may not alias each other.
    dx = dh.to(x_dtype, memory_format=torch.contiguous_format, copy=True)
    dresidual = dh.to(new_residual.dtype, memory_format=torch.contiguous_format, copy=True)
    return dx, dresidual, dw
