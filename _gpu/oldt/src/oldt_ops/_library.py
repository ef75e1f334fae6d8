"""Registers the RMSNorm ops with torch.library; their Triton kernels live in ``kernels.py``.

Each op is a schema and one Python kernel for CPU and CUDA, registered straight with the
dispatcher, as a C++ extension would. (``torch.library.custom_op`` builds the same op from type
hints but wraps every call in more Python, an aliasing check and a Dynamo guard, which costs tens
of microseconds a call: more than the kernel itself at decode sizes.)

CUDA tensors run the Triton kernels. CPU tensors run the pure-PyTorch reference, except under
``TRITON_INTERPRET=1`` (set before Triton is imported), where the Triton kernels themselves run on
the CPU: that is how the tests exercise the kernels on a machine without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

import torch

from . import reference
from ._checks import check_bwd_inputs, check_fused_bwd_inputs, check_fused_inputs, check_inputs

try:
    from . import kernels
except ModuleNotFoundError as e:  # Triton ships for Linux only; CPU tensors work without it.
    if e.name != "triton":
        raise
    kernels = None

TRITON_ON_CPU = kernels is not None and os.environ.get("TRITON_INTERPRET") == "1"

_lib = torch.library.Library("oldt_ops", "DEF")

# Each op's kernel by op name, for eager calls that need not go through the dispatcher.
PYTHON_KERNELS: dict[str, Callable] = {}

# No public function has an eager entry point in C++: ops.py runs its Python for every call.
EAGER_API: dict[str, Callable] = {}


def _op(schema: str):
    """Defines the op `schema` and registers the decorated function as its CPU and CUDA kernel."""

    def register(fn):
        _lib.define(schema)
        for device in ("CPU", "CUDA"):
            _lib.impl(fn.__name__, fn, device)
        PYTHON_KERNELS[fn.__name__] = fn
        return fn

    return register


def _backend(t: torch.Tensor) -> ModuleType:
    """The module that runs the ops on t's device: ``kernels`` (Triton) or ``reference``."""
    if t.device.type == "cuda":
        if kernels is None:
            raise RuntimeError("CUDA tensors need Triton: pip install triton")
        return kernels
    return kernels if TRITON_ON_CPU else reference


@_op("rms_norm_fwd(Tensor x, Tensor? weight, float eps) -> (Tensor, Tensor)")
def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    check_inputs(x, weight)
    return _backend(x).rms_norm_fwd(x, weight, eps)


@_op("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor")
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    # The forward alone, for calls that need no gradient: y, without the rstd that only the
    # backward reads. (The reference computes it anyway.)
    check_inputs(x, weight)
    if _backend(x) is reference:
        return reference.rms_norm_fwd(x, weight, eps)[0]
    return kernels.rms_norm(x, weight, eps)


@_op("rms_norm_bwd(Tensor grad_y, Tensor x, Tensor rstd, Tensor? weight) -> (Tensor, Tensor)")
def rms_norm_bwd(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    check_bwd_inputs(grad_y, x, rstd, weight)
    return _backend(x).rms_norm_bwd(grad_y, x, rstd, weight)


@_op(
    "fused_add_rms_norm_fwd(Tensor x, Tensor residual, Tensor? weight, float eps)"
    " -> (Tensor, Tensor, Tensor)"
)
def fused_add_rms_norm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_fused_inputs(x, residual, weight)
    return _backend(x).fused_add_rms_norm_fwd(x, residual, weight, eps)


@_op("fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor)")
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # As rms_norm: (y, new_residual), without rstd.
    check_fused_inputs(x, residual, weight)
    if _backend(x) is reference:
        return reference.fused_add_rms_norm_fwd(x, residual, weight, eps)[:2]
    return kernels.fused_add_rms_norm(x, residual, weight, eps)


@_op(
    "fused_add_rms_norm_bwd(Tensor grad_y, Tensor? grad_new_residual, Tensor new_residual,"
    " Tensor rstd, Tensor? weight, ScalarType x_dtype) -> (Tensor, Tensor, Tensor)"
)
def fused_add_rms_norm_bwd(
    grad_y: torch.Tensor,
    grad_new_residual: torch.Tensor | None,
    new_residual: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    x_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_fused_bwd_inputs(grad_y, grad_new_residual, new_residual, rstd, weight, x_dtype)
    return _backend(new_residual).fused_add_rms_norm_bwd(
        grad_y, grad_new_residual, new_residual, rstd, weight, x_dtype
    )


def _no_derivative(name: str) -> Callable:
    def backward(ctx, *grads):
        raise RuntimeError(
            f"derivative for {_lib.ns}::{name} is not implemented: this forward returns no rstd, "
            f"for calls that need no gradient; {name}_fwd has the backward"
        )

    return backward


# The forwards without rstd have no derivative. Without an autograd kernel, autograd would only
# warn and leave the inputs' gradients None; the C++ ops register torch's not-implemented kernel,
# which raises in the backward, as this does.
for _name in ("rms_norm", "fused_add_rms_norm"):
    torch.library.register_autograd(f"{_lib.ns}::{_name}", _no_derivative(_name), lib=_lib)
