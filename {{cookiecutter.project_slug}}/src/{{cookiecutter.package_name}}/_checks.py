"""Argument checks shared by the public API and the fake impls, so that bad input fails the same
way in eager mode, under torch.compile and on meta tensors: a Python exception naming the argument,
never a crash inside a kernel.

The building blocks of a new op's checks (``name`` is the argument's name in the message):

- ``check_float_tensor(name, t)``: a tensor of a dtype the kernels take (TypeError);
- ``check_same_device(name, t, ref_name, ref)``: on ref's device (ValueError);
- ``check_like(name, t, ref_name, ref)``: ref's shape and device (ValueError);
- ``check_dtype(name, t, dtype, dtype_of)``: the dtype of argument ``dtype_of`` (TypeError);
- ``as_float(name, value)``: a float argument as the ops take it, a Python float (TypeError);
- ``check_no_grad(op, **tensors)``: for an op without a backward, none requires grad
  (RuntimeError).
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the math runs in for ``x``: float64 for float64, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_dtype(name: str, dtype: torch.dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {dtype}")


def check_float_tensor(name: str, t: torch.Tensor) -> None:
    """t (argument ``name``) is a tensor of one of the FLOAT_DTYPES, which the kernels take."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _check_dtype(name, t.dtype)


def check_same_device(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} must be on {ref_name}'s device ({ref.device}), got {t.device}")


def check_like(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """t (argument ``name``) has the shape and device of ref (argument ``ref_name``)."""
    if t.shape != ref.shape:
        raise ValueError(
            f"{name} must have {ref_name}'s shape {tuple(ref.shape)}, got {tuple(t.shape)}"
        )
    check_same_device(name, t, ref_name, ref)


def check_dtype(name: str, t: torch.Tensor, dtype: torch.dtype, dtype_of: str) -> None:
    """t (argument ``name``) has dtype ``dtype``, that of argument ``dtype_of``."""
    if t.dtype != dtype:
        raise TypeError(f"{name} must have {dtype_of}'s dtype ({dtype}), got {t.dtype}")


def check_no_grad(op: str, **tensors: torch.Tensor | None) -> None:
    """For op, which has no backward: while autograd records, no tensor argument requires grad,
    which would otherwise leave a result that silently has no gradient."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(
                f"{op} has no backward, but {name} requires grad: call it under torch.no_grad()"
            )


def _check_residual_dtype(x_name: str, x_dtype: torch.dtype, name: str, dtype: torch.dtype) -> None:
    """The residual stream has x's dtype, or float32 under float16/bfloat16 x."""
    reduced = x_dtype in (torch.float16, torch.bfloat16)
    if dtype != x_dtype and not (reduced and dtype == torch.float32):
        also = " or float32" if reduced else ""
        raise TypeError(f"{name} must have {x_name}'s dtype ({x_dtype}){also}, got {dtype}")


def _check_rstd(rstd: torch.Tensor, x_name: str, x: torch.Tensor) -> None:
    """rstd as the forward returned it for the rows of x, in the compute dtype."""
    if rstd.shape != x.shape[:-1]:
        raise ValueError(f"rstd must have shape {tuple(x.shape[:-1])}, got {tuple(rstd.shape)}")
    want = compute_dtype(x)
    if rstd.dtype != want:
        raise TypeError(f"rstd must be {want} for {x_name} of dtype {x.dtype}, got {rstd.dtype}")
    check_same_device("rstd", rstd, x_name, x)


def as_float(name: str, value: float) -> float:
    """A float argument (``name``) as the ops take it, a Python float, or an error that names it."""
    if isinstance(value, (str, bool)):  # float() would take "1e-6" and True
        raise TypeError(f"{name} must be a float, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several elements
        raise TypeError(f"{name} must be a float, got {value!r}") from None


def as_eps(eps: float) -> float:
    """eps as the ops take it (a Python float), or an error that names it."""
    eps = as_float("eps", eps)
    if not eps >= 0:  # also NaN; either would make rows NaN
        raise ValueError(f"eps must be >= 0, got {eps}")
    return eps


def check_inputs(x: torch.Tensor, weight: torch.Tensor | None, x_name: str = "x") -> None:
    """Checks the arguments of rms_norm(x, weight); ``x_name`` names x in the messages."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{x_name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(
            f"{x_name} must have at least 1 dimension (the one normalized), got a 0-d tensor"
        )
    _check_dtype(x_name, x.dtype)
    if x.shape[-1] == 0:
        raise ValueError(
            f"{x_name} must have a non-empty last dimension, got shape {tuple(x.shape)}"
        )
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor or None, got {type(weight).__name__}")
    _check_dtype("weight", weight.dtype)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight must have shape ({x.shape[-1]},) to match the last dimension of {x_name}, "
            f"got {tuple(weight.shape)}"
        )
    check_same_device("weight", weight, x_name, x)


def check_bwd_inputs(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> None:
    """Checks the arguments of the backward op (normally produced by autograd, not by users)."""
    check_inputs(x, weight)
    check_like("grad_y", grad_y, "x", x)
    # The kernels read grad_y in x's dtype; autograd always produces it so.
    check_dtype("grad_y", grad_y, x.dtype, "x")
    _check_rstd(rstd, "x", x)


def check_fused_inputs(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
) -> None:
    """Checks the arguments of fused_add_rms_norm(x, residual, weight)."""
    check_inputs(x, weight)
    check_float_tensor("residual", residual)
    check_like("residual", residual, "x", x)
    _check_residual_dtype("x", x.dtype, "residual", residual.dtype)


def check_fused_bwd_inputs(
    grad_y: torch.Tensor,
    grad_new_residual: torch.Tensor | None,
    new_residual: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
) -> None:
    """Checks the arguments of the fused backward op (normally produced by autograd)."""
    check_inputs(new_residual, weight, "new_residual")
    check_like("grad_y", grad_y, "new_residual", new_residual)
    _check_dtype("grad_y", grad_y.dtype)
    _check_residual_dtype("grad_y", grad_y.dtype, "new_residual", new_residual.dtype)
    if grad_new_residual is not None:
        check_like("grad_new_residual", grad_new_residual, "new_residual", new_residual)
        check_dtype("grad_new_residual", grad_new_residual, new_residual.dtype, "new_residual")
    _check_rstd(rstd, "new_residual", new_residual)


def check_in_place_inputs(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
) -> None:
    """Checks the arguments of fused_add_rms_norm_, which writes its results into x and
    residual: as fused_add_rms_norm's, and both with rows the kernels can write (see row_stride)."""
    check_fused_inputs(x, residual, weight)
    for name, t in (("x", x), ("residual", residual)):
        _check_rows_to_write(name, t)


def row_stride(t: torch.Tensor) -> int | None:
    """The stride between consecutive rows of t (its slices along the last dimension) where one
    stride steps through all of them, as in a contiguous tensor or a slice of a wider one's
    columns (``base[..., :n]``); None where its leading dimensions step through them unevenly."""
    stride = expected = None
    for size, step in zip(t.shape[-2::-1], t.stride()[-2::-1], strict=True):  # inner dim first
        if size == 1:  # steps nowhere: its stride does not matter
            continue
        if expected is not None and step != expected:
            return None
        stride = step if stride is None else stride
        expected = step * size
    return t.shape[-1] if stride is None else stride


def _check_rows_to_write(name: str, t: torch.Tensor) -> None:
    """fused_add_rms_norm_ writes its result into t row by row: each row contiguous, the rows one
    stride apart (a contiguous tensor, or a slice of a wider one's columns) and not overlapping."""
    n = t.shape[-1]
    if n > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, as fused_add_rms_norm_ writes its "
            f"result into it, got strides {t.stride()}"
        )
    stride = row_stride(t)
    if stride is None or (t.numel() > n and stride < n):
        raise ValueError(
            f"{name}'s rows must be one stride apart and not overlap (as in a contiguous tensor, "
            "or a slice of a wider one's columns), as fused_add_rms_norm_ writes its result into "
            f"them, got shape {tuple(t.shape)} and strides {t.stride()}"
        )


def _byte_range(t: torch.Tensor) -> tuple[int, int] | None:
    """The addresses from t's first byte to past its last (t has any strides; empty: none), or
    None where t has no memory of its own: a tensor subclass such as DTensor, whose data_ptr() is
    0 (the op runs on its local tensors), or a tensor under vmap, which has no storage."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return None
    try:
        first = t.data_ptr()
    except RuntimeError:  # vmap's tensors: "Cannot access data pointer of Tensor ..."
        return None
    if t.numel() == 0:
        return first, first
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return first, first + (last + 1) * t.element_size()


def check_no_overlap(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None) -> None:
    """fused_add_rms_norm_ writes into x and residual while it reads all three: neither may share
    memory with another argument. Needs real data pointers: eager mode only, and tensors with
    memory of their own (others are not compared)."""
    pairs = [("x", x, "residual", residual)]
    if weight is not None:
        pairs += [("x", x, "weight", weight), ("residual", residual, "weight", weight)]
    for a_name, a, b_name, b in pairs:
        a_range, b_range = _byte_range(a), _byte_range(b)
        if a_range is None or b_range is None:
            continue
        (a0, a1), (b0, b1) = a_range, b_range
        if a0 < b1 and b0 < a1:
            raise ValueError(f"{a_name} and {b_name} must not overlap in memory")
