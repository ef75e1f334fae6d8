"""Argument checks shared by the public API and the fake impls, so that bad input fails the same
way in eager mode, under torch.compile and on meta tensors: a Python exception naming the argument,
never a crash inside a kernel."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}")


def check_inputs(x: torch.Tensor, weight: torch.Tensor | None) -> None:
    """Checks the arguments of rms_norm(x, weight)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension (the one normalized), got a 0-d tensor")
    _check_dtype("x", x)
    if x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor or None, got {type(weight).__name__}")
    _check_dtype("weight", weight)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight must have shape ({x.shape[-1]},) to match the last dimension of x, "
            f"got {tuple(weight.shape)}"
        )
    if weight.device != x.device:
        raise ValueError(f"weight must be on x's device ({x.device}), got {weight.device}")


def check_bwd_inputs(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> None:
    """Checks the arguments of the backward op (normally produced by autograd, not by users)."""
    check_inputs(x, weight)
    if grad_y.shape != x.shape:
        raise ValueError(f"grad_y must have x's shape {tuple(x.shape)}, got {tuple(grad_y.shape)}")
    _check_dtype("grad_y", grad_y)
    if rstd.shape != x.shape[:-1]:
        raise ValueError(f"rstd must have shape {tuple(x.shape[:-1])}, got {tuple(rstd.shape)}")
    for name, t in (("grad_y", grad_y), ("rstd", rstd)):
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device ({x.device}), got {t.device}")


def check_fused_inputs(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
) -> None:
    """Checks the arguments of fused_add_rms_norm(x, residual, weight)."""
    check_inputs(x, weight)
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    _check_dtype("residual", residual)
    if residual.shape != x.shape:
        raise ValueError(
            f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
        )
    if residual.device != x.device:
        raise ValueError(f"residual must be on x's device ({x.device}), got {residual.device}")
