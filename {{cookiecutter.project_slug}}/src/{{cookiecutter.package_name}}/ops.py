"""Public functional API and autograd for the RMSNorm ops.

The ops themselves are ``rms_norm_fwd`` and ``rms_norm_bwd``, registered in ``_library``.
Autograd is attached with ``torch.library.register_autograd``, so torch.compile traces both
passes into its graph as these two ops.
"""

from __future__ import annotations

import torch

from . import _library, abstract_impls  # noqa: F401  (registers the ops and their fake impls)
from ._checks import check_inputs


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
    y, _ = torch.ops.{{ cookiecutter.package_name }}.rms_norm_fwd(x, weight, float(eps))
    return y


def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)


def _backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = torch.ops.{{ cookiecutter.package_name }}.rms_norm_bwd(grad_y, x, rstd, weight)
    need_dx, need_dw, _ = ctx.needs_input_grad
    return dx if need_dx else None, dw if need_dw else None, None


torch.library.register_autograd(
    "{{ cookiecutter.package_name }}::rms_norm_fwd",
    _backward,
    setup_context=_setup_context,
)
