"""Public functional API and autograd for the RMSNorm ops.

Each op is a forward/backward pair registered in ``_library``. Autograd is attached with
``torch.library.register_autograd``, so torch.compile traces both passes into its graph as these
ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _library, abstract_impls  # noqa: F401  (registers the ops and their fake impls)
from ._checks import check_fused_inputs, check_inputs

_OPS = torch.ops.{{ cookiecutter.package_name }}


def _autograd(name: str, backward: Callable, setup_context: Callable) -> Callable:
    """Registers the autograd formula of op ``name``; returns a caller of the op for the API.

    The registered formula is what torch.compile traces and what a call through ``torch.ops``
    uses. In eager mode it costs a dispatcher round trip into Python, a redispatch and argument
    normalisation on every call: more host time than a decode-size kernel runs. So the caller
    runs the same ``setup_context`` and ``backward`` as a plain ``autograd.Function`` around the
    op's kernel when an input requires grad, and goes straight to the kernel when none does.
    """
    op = getattr(_OPS, name).default
    torch.library.register_autograd(op, backward, setup_context=setup_context)

    def forward(ctx, *args):
        with torch._C._AutoDispatchBelowAutograd():
            output = op(*args)
        setup_context(ctx, args, output)
        return output

    # Named after the op: a tensor's grad_fn reads e.g. "rms_norm_fwdBackward".
    function = type(
        name,
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )

    def call(*args):
        if torch.compiler.is_compiling():
            return op(*args)
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return call


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
    y, _ = _rms_norm_fwd(x, weight, float(eps))
    return y


def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    # rstd is returned only for the backward to reuse: no gradient flows through it, and none
    # is materialized (a zero-filled tensor and a kernel launch per call).
    ctx.mark_non_differentiable(rstd)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_y, _grad_rstd):
    if grad_y is None:  # no gradient reached y (grads are not materialized as zeros)
        return None, None, None
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _OPS.rms_norm_bwd(grad_y, x, rstd, weight)
    need_dx, need_dw, _ = ctx.needs_input_grad
    return dx if need_dx else None, dw if need_dw else None, None


_rms_norm_fwd = _autograd("rms_norm_fwd", _backward, _setup_context)


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
    y, new_residual, _ = _fused_add_rms_norm_fwd(x, residual, weight, float(eps))
    return y, new_residual


def _fused_setup_context(ctx, inputs, output):
    x, _residual, weight, _eps = inputs
    _y, new_residual, rstd = output
    ctx.save_for_backward(new_residual, weight, rstd)
    ctx.x_dtype = x.dtype
    ctx.mark_non_differentiable(rstd)
    ctx.set_materialize_grads(False)


def _fused_backward(ctx, grad_y, grad_new_residual, _grad_rstd):
    new_residual, weight, rstd = ctx.saved_tensors
    if grad_y is None:
        # Only new_residual's gradient arrived (grads are not materialized as zeros): it flows
        # unchanged into x and residual.
        if grad_new_residual is None:
            return None, None, None, None
        dx, dresidual, dw = grad_new_residual.to(ctx.x_dtype), grad_new_residual, None
    else:
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


_fused_add_rms_norm_fwd = _autograd("fused_add_rms_norm_fwd", _fused_backward, _fused_setup_context)
