"""Fake ("abstract") impls: output shapes and dtypes without running a kernel.

torch.compile, torch.export and meta tensors call these instead of the kernels.
"""

from __future__ import annotations

import torch

from ._checks import check_bwd_inputs, check_fused_bwd_inputs, check_fused_inputs, check_inputs
from .reference import compute_dtype


def _weight_grad(weight, like):
    # Without a weight there is no weight gradient: an empty placeholder keeps the schema fixed.
    return (
        like.new_empty(0, dtype=torch.float32) if weight is None else weight.new_empty(weight.shape)
    )


@torch.library.register_fake("oldt_ops::rms_norm_fwd")
def _rms_norm_fwd_fake(x, weight, eps):
    check_inputs(x, weight)
    y = x.new_empty(x.shape)
    rstd = x.new_empty(x.shape[:-1], dtype=compute_dtype(x))
    return y, rstd


@torch.library.register_fake("oldt_ops::rms_norm")
def _rms_norm_fake(x, weight, eps):
    check_inputs(x, weight)
    return x.new_empty(x.shape)


@torch.library.register_fake("oldt_ops::rms_norm_bwd")
def _rms_norm_bwd_fake(grad_y, x, rstd, weight):
    check_bwd_inputs(grad_y, x, rstd, weight)
    dx = x.new_empty(x.shape)
    return dx, _weight_grad(weight, x)


@torch.library.register_fake("oldt_ops::fused_add_rms_norm_fwd")
def _fused_add_rms_norm_fwd_fake(x, residual, weight, eps):
    check_fused_inputs(x, residual, weight)
    y = x.new_empty(x.shape)
    new_residual = residual.new_empty(x.shape)
    rstd = x.new_empty(x.shape[:-1], dtype=compute_dtype(residual))
    return y, new_residual, rstd


@torch.library.register_fake("oldt_ops::fused_add_rms_norm")
def _fused_add_rms_norm_fake(x, residual, weight, eps):
    check_fused_inputs(x, residual, weight)
    return x.new_empty(x.shape), residual.new_empty(x.shape)


@torch.library.register_fake("oldt_ops::fused_add_rms_norm_bwd")
def _fused_add_rms_norm_bwd_fake(grad_y, grad_new_residual, new_residual, rstd, weight, x_dtype):
    check_fused_bwd_inputs(grad_y, grad_new_residual, new_residual, rstd, weight, x_dtype)
    dx = new_residual.new_empty(new_residual.shape, dtype=x_dtype)
    dresidual = new_residual.new_empty(new_residual.shape)
    return dx, dresidual, _weight_grad(weight, new_residual)
