"""RMSNorm over the last dimension: ``y = x / sqrt(mean(x**2) + eps) * weight``.

The op is three ``torch.library`` operators:

- ``rms_norm_fwd(x, weight, eps) -> (y, rstd)`` for calls that autograd records (the backward
  reuses the per-row ``rstd``);
- ``rms_norm_bwd(grad_y, x, rstd, weight) -> (dx, dw)``, its backward;
- ``rms_norm(x, weight, eps) -> y`` for calls that need no gradient: no rstd computed or stored.
{% if cookiecutter.variant == 'cpp' %}
Their schemas and CPU kernels are in ``csrc/rms_norm.cpp``, their CUDA kernels in
``csrc/cuda/rms_norm.cu``. This file adds what torch.compile needs (fake impls: output shapes
without running a kernel), the autograd formula, and the public function.
{%- else %}
Each is a ``torch.library.triton_op``: CUDA tensors run the Triton kernels of
``rms_norm_kernels.py``, which torch.compile traces into its graph; other devices run the
reference below. This file also holds the autograd formula and the public function.
{%- endif %}
"""

from __future__ import annotations

import torch
from torch.autograd.forward_ad import unpack_dual
{%- if cookiecutter.variant == 'triton' %}
from torch.library import triton_op

from . import rms_norm_kernels as kernels
{%- else %}
{% endif %}
from ._checks import as_eps, check_bwd_inputs, check_inputs, compute_dtype

ops = torch.ops.{{ cookiecutter.package_name }}  # the operators this package defines


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """The pure-PyTorch RMSNorm that tests and benchmarks compare the op against. Math in float32
    (float64 for float64 ``x``), output in ``x``'s dtype; differentiable by any autograd."""
    xf = x.to(compute_dtype(x))
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    return y.to(x.dtype)
{% if cookiecutter.variant == 'cpp' %}

@torch.library.register_fake("{{ cookiecutter.package_name }}::rms_norm_fwd")
def _(x, weight, eps):
    check_inputs(x, weight)
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=compute_dtype(x))


@torch.library.register_fake("{{ cookiecutter.package_name }}::rms_norm")
def _(x, weight, eps):
    check_inputs(x, weight)
    return x.new_empty(x.shape)


@torch.library.register_fake("{{ cookiecutter.package_name }}::rms_norm_bwd")
def _(grad_y, x, rstd, weight):
    check_bwd_inputs(grad_y, x, rstd, weight)
    dw = x.new_empty(0, dtype=torch.float32) if weight is None else weight.new_empty(x.shape[-1])
    return x.new_empty(x.shape), dw
{% else %}

@triton_op("{{ cookiecutter.package_name }}::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    check_inputs(x, weight)
    if x.device.type != "cuda":
        xf = x.to(compute_dtype(x))
        rstd = torch.rsqrt(xf.square().mean(-1) + eps)
        return rms_norm_reference(x, weight, eps).contiguous(), rstd.contiguous()
    y, rstd = kernels.rms_norm_fwd(x, weight, eps, with_rstd=True)
    return y, rstd


@triton_op("{{ cookiecutter.package_name }}::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    check_inputs(x, weight)
    if x.device.type != "cuda":
        return rms_norm_reference(x, weight, eps).contiguous()
    return kernels.rms_norm_fwd(x, weight, eps, with_rstd=False)[0]


@triton_op("{{ cookiecutter.package_name }}::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    check_bwd_inputs(grad_y, x, rstd, weight)
    if x.device.type != "cuda":
        # The backward written out: x_hat = x * rstd, g = grad_y * weight,
        # dx = rstd * (g - x_hat * mean(x_hat * g)), dw = sum over rows of grad_y * x_hat.
        ct = compute_dtype(x)
        r = rstd.to(ct).unsqueeze(-1)
        x_hat, dy = x.to(ct) * r, grad_y.to(ct)
        g = dy if weight is None else dy * weight.to(ct)
        dx = (r * (g - x_hat * (x_hat * g).mean(-1, keepdim=True))).to(x.dtype).contiguous()
        if weight is None:
            return dx, x.new_empty(0, dtype=torch.float32)
        return dx, (dy * x_hat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return kernels.rms_norm_bwd(grad_y, x, rstd, weight)
{% endif %}

def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    # rstd is saved for the backward, not differentiated. Without these two lines autograd would
    # fill a zero gradient for it, a kernel launch, on every backward.
    ctx.mark_non_differentiable(rstd)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_y, _grad_rstd):
    if grad_y is None:  # y's gradient is zero, passed as None (see _setup_context)
        return None, None, None
    x, weight, rstd = ctx.saved_tensors
    dx, dw = ops.rms_norm_bwd(grad_y, x, rstd, weight)
    need_dx, need_dw, _ = ctx.needs_input_grad
    return dx if need_dx else None, dw if need_dw else None, None


torch.library.register_autograd(
    "{{ cookiecutter.package_name }}::rms_norm_fwd",
    _backward,
    setup_context=_setup_context,
)


def _no_derivative(ctx, *grads):
    raise RuntimeError(
        f"{ops.name}::rms_norm_bwd has no derivative: a gradient of the gradient "
        "(create_graph=True, then a second backward) is not supported; differentiate "
        "rms_norm_reference for that"
    )


# Without this, a second backward through the gradient would be silently wrong.
torch.library.register_autograd(
    "{{ cookiecutter.package_name }}::rms_norm_bwd",
    _no_derivative,
)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x``: ``x / sqrt(mean(x**2) + eps) * weight``.

    ``x``: float32, float16, bfloat16 or float64, any leading dimensions and strides. ``weight``
    (optional, shape ``(x.shape[-1],)``) may have another float dtype. Math runs in float32
    (float64 for float64 ``x``); ``y`` has ``x``'s dtype. Differentiable (backward mode);
    under forward-mode AD (``torch.func.jvp``, dual tensors) it runs ``rms_norm_reference``.
    """
    check_inputs(x, weight)
    eps = as_eps(eps)
    inputs = (x,) if weight is None else (x, weight)
    if any(unpack_dual(t).tangent is not None for t in inputs):
        return rms_norm_reference(x, weight, eps)  # the ops have no forward-mode formula
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return ops.rms_norm_fwd(x, weight, eps)[0]
    return ops.rms_norm(x, weight, eps)
