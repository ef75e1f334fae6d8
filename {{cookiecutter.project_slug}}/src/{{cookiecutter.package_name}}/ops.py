"""Public functional API and autograd for the RMSNorm ops.

Each op is a forward/backward pair registered in ``_library``. Autograd is attached with
``torch.library.register_autograd``, so torch.compile traces both passes into its graph as these
ops.
"""

from __future__ import annotations

import torch

from . import _library, abstract_impls  # noqa: F401  (registers the ops and their fake impls)
from ._checks import check_fused_inputs, check_inputs

_OPS = torch.ops.{{ cookiecutter.package_name }}


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x``: ``x / sqrt(mean(x**2) + eps) * weight``.

    ``x`` may have any number of leading dimensions and any strides; float32, float16, bfloat16
    (and float64). ``weight`` may have another float dtype than ``x``. Math runs in float32; the
    output has ``x``'s dtype and the weight gradient ``weight``'s dtype.
    """
    check_inputs(x, weight)
    y, _ = _OPS.rms_norm_fwd(x, weight, float(eps))
    return y


def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)


def _backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _OPS.rms_norm_bwd(grad_y, x, rstd, weight)
    need_dx, need_dw, _ = ctx.needs_input_grad
    return dx if need_dx else None, dw if need_dw else None, None


torch.library.register_autograd(
    "{{ cookiecutter.package_name }}::rms_norm_fwd",
    _backward,
    setup_context=_setup_context,
)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` then ``y = rms_norm(h, weight, eps)`` in one pass; returns ``(y, h)``.

    ``h`` (the new residual stream) is stored in ``residual``'s dtype and ``y`` in ``x``'s, as in
    ``h = h + attn(h); x = norm(h)`` of a transformer block. Gradients flowing into ``h`` are added
    to those coming through ``y``.
    """
    check_fused_inputs(x, residual, weight)
    y, new_residual, _ = _OPS.fused_add_rms_norm_fwd(x, residual, weight, float(eps))
    return y, new_residual


def _fused_setup_context(ctx, inputs, output):
    x, _residual, weight, _eps = inputs
    _y, new_residual, rstd = output
    ctx.save_for_backward(new_residual, weight, rstd)
    ctx.x_dtype = x.dtype


def _fused_backward(ctx, grad_y, grad_new_residual, _grad_rstd):
    new_residual, weight, rstd = ctx.saved_tensors
    dx, dresidual, dw = _OPS.fused_add_rms_norm_bwd(
        grad_y, grad_new_residual, new_residual, rstd, weight, ctx.x_dtype
    )
    need_dx, need_dresidual, need_dw, _ = ctx.needs_input_grad
    return (
        dx if need_dx else None,
        dresidual if need_dresidual else None,
        dw if need_dw else None,
        None,
    )


torch.library.register_autograd(
    "{{ cookiecutter.package_name }}::fused_add_rms_norm_fwd",
    _fused_backward,
    setup_context=_fused_setup_context,
)
