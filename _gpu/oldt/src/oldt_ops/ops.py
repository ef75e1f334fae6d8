"""Public functional API and autograd for the RMSNorm ops.

Each op is a forward/backward pair, registered when ``_library`` is imported, and a forward
alone that returns no rstd, for calls that need no gradient. Autograd is attached with
``torch.library.register_autograd``, so torch.compile traces both passes into its graph as these
ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import forward_ad

from . import (
    _library,
    abstract_impls,  # noqa: F401  (registers the ops' fake impls)
    reference,
)
from ._checks import as_eps, check_fused_inputs, check_inputs

_OPS = torch.ops.oldt_ops


# What an eager call may hand straight to a Python kernel: argument types of ops, with plain
# tensors only (a tensor subclass may redefine what an op does).
_PLAIN_TYPES = frozenset(
    {torch.Tensor, torch.nn.Parameter, float, int, bool, type(None), torch.dtype}
)


def _plain_call(args: tuple) -> bool:
    """Whether the dispatcher would only pass this call on to the op's CPU or CUDA kernel: plain
    tensors, and no mode, functorch transform, profiler or jit trace that acts on dispatched
    ops."""
    x = args[0]
    return (
        (x.is_cuda or x.is_cpu)
        and _PLAIN_TYPES.issuperset(map(type, args))
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and not torch._C._autograd._profiler_enabled()
        and torch._C._get_tracing_state() is None
    )


def _below_autograd(name: str) -> Callable:
    """A caller of op ``name`` that skips its autograd formula (its caller handles autograd).

    Where the op's kernel is Python, a plain call runs it directly: the dispatcher's round trip
    into a Python kernel costs more host time than a decode-size kernel runs. Anything that
    would act on the dispatched op (a mode, a transform, a subclass, the profiler that names
    it) gets the op.
    """
    op = getattr(_OPS, name).default
    kernel = _library.PYTHON_KERNELS.get(name)

    def call(*args):
        if kernel is not None and _plain_call(args):
            return kernel(*args)
        if torch.is_inference_mode_enabled():  # autograd is off in the dispatcher already
            return op(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return call


def _autograd(name: str, backward: Callable, setup_context: Callable) -> Callable:
    """Registers the autograd formula of op ``name``; returns a caller of the op for the API.

    The registered formula is what torch.compile traces and what a call through ``torch.ops``
    uses. In eager mode it costs a dispatcher round trip into Python, a redispatch and argument
    normalisation on every call: more host time than a decode-size kernel runs. So in eager mode
    the caller runs the same ``setup_context`` and ``backward`` as a plain ``autograd.Function``
    around the op's kernel when an input requires grad, and goes straight to the kernel when none
    does.
    """
    op = getattr(_OPS, name).default
    torch.library.register_autograd(op, backward, setup_context=setup_context)
    kernel = _below_autograd(name)

    def forward(ctx, *args):
        output = kernel(*args)
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
        return kernel(*args)

    return call


def _eager(name: str, *args):
    """Public function ``name`` called through its C++ entry point (``_library.EAGER_API``) where
    it has one and the call is eager; else NotImplemented, for the caller to run its Python.

    The entry point checks the arguments, records the autograd formula and launches the kernels
    without Python in between, which saves a decode-size call microseconds of host time. It takes
    plain calls only (no mode, subclass, functorch transform or jit trace) and returns
    NotImplemented for the others.
    """
    entry = _library.EAGER_API.get(name)
    if entry is None or torch.compiler.is_compiling():
        return NotImplemented
    return entry(*args)


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records this call. If not, the forward without rstd runs: the rstd that
    only the backward reads is neither computed nor stored (on an H100, at N = 1024, about 1%
    of the forward's time)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _forward_only(name: str) -> Callable:
    """A caller of op ``name``, a forward that returns no rstd and has no autograd formula: for
    calls where ``_needs_grad`` is false."""
    op = getattr(_OPS, name).default
    kernel = _below_autograd(name)

    def call(*args):
        return op(*args) if torch.compiler.is_compiling() else kernel(*args)

    return call


def _needs_reference(*tensors: torch.Tensor | None) -> bool:
    """Whether a call must run the pure-PyTorch reference, which every kind of autograd
    differentiates: under forward-mode AD (dual tensors, ``torch.func.jvp``) with a tangent on an
    input, which would silently find no tangent in the ops' outputs (they have backward formulas
    only), or where a torch.func transform (``grad``, ``vjp``, ``jacrev``) differentiates the
    call, which it cannot do through the ops' registered autograd. (Under ``vmap`` alone the ops
    run.)"""
    present = [t for t in tensors if t is not None]
    if forward_ad._current_level >= 0 and any(
        forward_ad.unpack_dual(t).tangent is not None for t in present
    ):
        return True
    return (
        torch._C._are_functorch_transforms_active()
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in present)
    )


class _NoDerivative(torch.autograd.Function):
    """Passes a backward op's outputs through; differentiating them raises.

    A backward op has no derivative of its own. For one without an autograd kernel, autograd
    only warns, and a gradient of a gradient (``create_graph=True``, then a second backward)
    comes out silently wrong. C++ ops register torch's not-implemented kernel, which raises;
    this raises the same way for ops whose kernels are Python.
    """

    @staticmethod
    def forward(name, *outputs):
        return outputs

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.name = inputs[0]

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            f"derivative for {_OPS.name}::{ctx.name} is not implemented: the gradient of a "
            "gradient through this op (create_graph=True, then a second backward) is not "
            f"supported; differentiate {reference.__name__} for that"
        )


def _backward_op(name: str) -> Callable:
    """A caller of backward op ``name`` for the autograd formulas: the op, or its Python kernel
    directly for a plain call made without grad mode (as backward normally runs). Under grad
    mode (``create_graph=True``) the outputs of a Python kernel pass through ``_NoDerivative``."""
    op = getattr(_OPS, name).default
    kernel = _library.PYTHON_KERNELS.get(name)
    if kernel is None:
        return op

    def call(*args):
        if not torch.is_grad_enabled():
            return kernel(*args) if _plain_call(args) else op(*args)
        return _NoDerivative.apply(name, *op(*args))

    return call


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x``: ``x / sqrt(mean(x**2) + eps) * weight``.

    ``x`` may have any number of leading dimensions and any strides; float32, float16, bfloat16
    (and float64). ``weight`` may have another float dtype than ``x``. Math runs in float32
    (float64 for float64 ``x``); the output has ``x``'s dtype and the weight gradient
    ``weight``'s dtype. Under torch.func transforms and forward-mode AD it runs the pure-PyTorch
    reference.
    """
    y = _eager("rms_norm", x, weight, eps)
    if y is NotImplemented:
        check_inputs(x, weight)
        if _needs_reference(x, weight):
            return reference.rms_norm(x, weight, eps)
        if not _needs_grad(x, weight):
            return _rms_norm(x, weight, as_eps(eps))
        y, _ = _rms_norm_fwd(x, weight, as_eps(eps))
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
    dx, dw = _rms_norm_bwd(grad_y, x, rstd, weight)
    need_dx, need_dw, _ = ctx.needs_input_grad
    return dx if need_dx else None, dw if need_dw else None, None


_rms_norm = _forward_only("rms_norm")
_rms_norm_bwd = _backward_op("rms_norm_bwd")
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
    to those coming through ``y``. Under torch.func transforms and forward-mode AD it runs the
    pure-PyTorch reference.
    """
    out = _eager("fused_add_rms_norm", x, residual, weight, eps)
    if out is NotImplemented:
        check_fused_inputs(x, residual, weight)
        if _needs_reference(x, residual, weight):
            return reference.fused_add_rms_norm(x, residual, weight, eps)
        if not _needs_grad(x, residual, weight):
            return _fused_add_rms_norm(x, residual, weight, as_eps(eps))
        y, new_residual, _ = _fused_add_rms_norm_fwd(x, residual, weight, as_eps(eps))
        out = y, new_residual
    return out


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
        dx, dresidual, dw = _fused_add_rms_norm_bwd(
            grad_y, grad_new_residual, new_residual, rstd, weight, ctx.x_dtype
        )
    need_dx, need_dresidual, need_dw, _ = ctx.needs_input_grad
    return (
        dx if need_dx else None,
        dresidual if need_dresidual else None,
        dw if need_dw else None,
        None,
    )


_fused_add_rms_norm = _forward_only("fused_add_rms_norm")
_fused_add_rms_norm_bwd = _backward_op("fused_add_rms_norm_bwd")
_fused_add_rms_norm_fwd = _autograd("fused_add_rms_norm_fwd", _fused_backward, _fused_setup_context)
