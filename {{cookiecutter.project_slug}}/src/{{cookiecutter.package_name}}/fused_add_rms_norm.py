"""Residual add fused with RMSNorm: ``h = x + residual``, ``y = rms_norm(h, weight, eps)``.

A transformer block adds each sublayer's output to the residual stream and normalizes the sum
for the next sublayer; one pass over memory does both. As for ``rms_norm``, three operators:

- ``fused_add_rms_norm_fwd(x, residual, weight, eps) -> (y, new_residual, rstd)``;
- ``fused_add_rms_norm_bwd(grad_y, grad_new_residual, new_residual, rstd, weight) -> (dh, dw)``,
  where ``dh`` is the gradient of both ``x`` and ``residual``;
- ``fused_add_rms_norm(x, residual, weight, eps) -> (y, new_residual)``, without rstd;

and ``fused_add_rms_norm_(x, residual, weight, eps)``, which writes ``y`` into ``x`` and the new
residual into ``residual``: the in-place form inference engines use, with no backward.
{% if cookiecutter.variant == 'cpp' %}
Schemas and CPU kernels: ``csrc/fused_add_rms_norm.cpp``; CUDA kernels:
``csrc/cuda/fused_add_rms_norm.cu``.
{%- else %}
Triton kernels: ``fused_add_rms_norm_kernels.py``; other devices reuse the ``rms_norm`` ops.
{%- endif %}
"""

from __future__ import annotations

import torch
from torch.autograd.forward_ad import unpack_dual
{%- if cookiecutter.variant == 'triton' %}
from torch.library import triton_op

from . import fused_add_rms_norm_kernels as kernels
{%- else %}
{% endif %}
from ._checks import (
    as_eps,
    check_fused_bwd_inputs,
    check_fused_inputs,
    check_in_place_inputs,
    check_no_grad,
    check_no_overlap,
    compute_dtype,
)
from .rms_norm import rms_norm_reference

ops = torch.ops.{{ cookiecutter.package_name }}  # the operators this package defines


def _add(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``x + residual`` in the compute dtype, rounded to ``residual``'s dtype, as the kernels
    store it (``y`` normalizes ``h`` as rounded)."""
    return (x.to(compute_dtype(residual)) + residual).to(residual.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pure-PyTorch ``(y, h)`` that tests and benchmarks compare the op against."""
    h = _add(x, residual)
    return rms_norm_reference(h, weight, eps).to(x.dtype), h
{% if cookiecutter.variant == 'cpp' %}

@torch.library.register_fake("{{ cookiecutter.package_name }}::fused_add_rms_norm_fwd")
def _(x, residual, weight, eps):
    check_fused_inputs(x, residual, weight)
    rstd = x.new_empty(x.shape[:-1], dtype=compute_dtype(x))
    return x.new_empty(x.shape), residual.new_empty(x.shape), rstd


@torch.library.register_fake("{{ cookiecutter.package_name }}::fused_add_rms_norm")
def _(x, residual, weight, eps):
    check_fused_inputs(x, residual, weight)
    return x.new_empty(x.shape), residual.new_empty(x.shape)


@torch.library.register_fake("{{ cookiecutter.package_name }}::fused_add_rms_norm_")
def _(x, residual, weight, eps):
    check_in_place_inputs(x, residual, weight)  # returns nothing: x and residual are its outputs


@torch.library.register_fake("{{ cookiecutter.package_name }}::fused_add_rms_norm_bwd")
def _(grad_y, grad_new_residual, new_residual, rstd, weight):
    check_fused_bwd_inputs(grad_y, grad_new_residual, new_residual, rstd, weight)
    shape = new_residual.shape
    dw = rstd.new_empty(0, dtype=torch.float32) if weight is None else weight.new_empty(shape[-1])
    return new_residual.new_empty(shape), dw
{% else %}

@triton_op("{{ cookiecutter.package_name }}::fused_add_rms_norm_fwd", mutates_args=())
def _fused_add_rms_norm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_fused_inputs(x, residual, weight)
    if x.device.type != "cuda":
        h = _add(x, residual).contiguous()
        y, rstd = ops.rms_norm_fwd(h, weight, eps)
        return y.to(x.dtype), h, rstd
    y, h, rstd = kernels.fused_add_rms_norm_fwd(x, residual, weight, eps, with_rstd=True)
    return y, h, rstd


@triton_op("{{ cookiecutter.package_name }}::fused_add_rms_norm", mutates_args=())
def _fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    check_fused_inputs(x, residual, weight)
    if x.device.type != "cuda":
        y, h, _ = _fused_add_rms_norm_fwd(x, residual, weight, eps)
        return y, h
    y, h, _ = kernels.fused_add_rms_norm_fwd(x, residual, weight, eps, with_rstd=False)
    return y, h


# mutates_args names the arguments the op writes into; the op returns nothing.
@triton_op(
    "{{ cookiecutter.package_name }}::fused_add_rms_norm_",
    mutates_args=("x", "residual"),
)
def _fused_add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> None:
    check_in_place_inputs(x, residual, weight)
    if x.device.type != "cuda":
        y, h, _ = _fused_add_rms_norm_fwd(x, residual, weight, eps)
        residual.copy_(h)
        x.copy_(y)
        return
    kernels.fused_add_rms_norm_(x, residual, weight, eps)


@triton_op("{{ cookiecutter.package_name }}::fused_add_rms_norm_bwd", mutates_args=())
def _fused_add_rms_norm_bwd(
    grad_y: torch.Tensor,
    grad_new_residual: torch.Tensor | None,
    new_residual: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_fused_bwd_inputs(grad_y, grad_new_residual, new_residual, rstd, weight)
    if new_residual.device.type != "cuda":
        h = new_residual
        dh, dw = ops.rms_norm_bwd(grad_y.to(h.dtype), h, rstd, weight)
        if grad_new_residual is not None:
            dh = dh + grad_new_residual
        return dh, dw
    return kernels.fused_add_rms_norm_bwd(grad_y, grad_new_residual, new_residual, rstd, weight)
{% endif %}

def _setup_context(ctx, inputs, output):
    x, _residual, weight, _eps = inputs
    _y, new_residual, rstd = output
    ctx.save_for_backward(new_residual, weight, rstd)
    ctx.x_dtype = x.dtype
    # As in rms_norm: no zero gradients filled for rstd, nor for an output the loss does not use
    # (those arrive as None).
    ctx.mark_non_differentiable(rstd)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_y, grad_new_residual, _grad_rstd):
    new_residual, weight, rstd = ctx.saved_tensors
    if grad_y is None:  # no gradient through y: h's is grad_new_residual's (None: zero)
        dh, dw = grad_new_residual, None
    else:
        dh, dw = ops.fused_add_rms_norm_bwd(grad_y, grad_new_residual, new_residual, rstd, weight)
    need_dx, need_dres, need_dw, _ = ctx.needs_input_grad
    # h = x + residual: both get dh, x's rounded to its dtype when residual's is wider.
    dx = dh.to(ctx.x_dtype) if need_dx and dh is not None else None
    return dx, dh if need_dres else None, dw if need_dw else None, None


torch.library.register_autograd(
    "{{ cookiecutter.package_name }}::fused_add_rms_norm_fwd",
    _backward,
    setup_context=_setup_context,
)


def _no_derivative(ctx, *grads):
    raise RuntimeError(
        f"{ops.name}::fused_add_rms_norm_bwd has no derivative: a gradient of the gradient is "
        "not supported; differentiate fused_add_rms_norm_reference for that"
    )


torch.library.register_autograd(
    "{{ cookiecutter.package_name }}::fused_add_rms_norm_bwd",
    _no_derivative,
)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual``, then ``y = rms_norm(h, weight, eps)``; returns ``(y, h)``.

    ``residual`` has ``x``'s shape and dtype, or float32 under float16/bfloat16 ``x``. ``h`` (the
    new residual stream) is stored in ``residual``'s dtype and ``y`` in ``x``'s. Gradients that
    reach ``h`` directly are added to those that come through ``y``.
    """
    check_fused_inputs(x, residual, weight)
    eps = as_eps(eps)
    inputs = (x, residual) if weight is None else (x, residual, weight)
    if any(unpack_dual(t).tangent is not None for t in inputs):
        return fused_add_rms_norm_reference(x, residual, weight, eps)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        y, h, _ = ops.fused_add_rms_norm_fwd(x, residual, weight, eps)
        return y, h
    return ops.fused_add_rms_norm(x, residual, weight, eps)


def fused_add_rms_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    """In place, for inference: ``residual += x``, then ``x = rms_norm(residual, weight, eps)``.

    The ``(y, h)`` of ``fused_add_rms_norm`` written into ``x`` and ``residual`` instead of new
    tensors, so a model allocates nothing per layer (and a CUDA graph replays the same buffers).
    ``x`` and ``residual`` may be slices of wider rows (``base[..., :n]``): each must have
    contiguous rows one stride apart, and overlap neither the other nor ``weight``.
    It has no backward: call it under ``torch.no_grad()`` or ``torch.inference_mode()``.
    """
    check_in_place_inputs(x, residual, weight)
    if x.device.type != "meta" and not torch.compiler.is_compiling():
        check_no_overlap(x, residual, weight)  # reads data pointers, which traced tensors lack
    check_no_grad("fused_add_rms_norm_", x=x, residual=residual, weight=weight)
    ops.fused_add_rms_norm_(x, residual, weight, as_eps(eps))
