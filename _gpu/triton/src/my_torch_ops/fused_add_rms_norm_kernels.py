"""Fused residual-add RMSNorm's Triton kernels, its backward's launch choices and host functions:
h = x + residual, rounded to residual's dtype, is stored as the new residual and y = rms_norm(h),
in one pass over memory each way (the backward adds h's own gradient as it stores dh, the gradient
of both x and residual)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .blocks import (
    Launch,
    add_to_row,
    dot_rest,
    grad_x,
    launch_backward,
    launch_forward,
    load_tile,
    load_weight,
    normalize_rest,
    register_row_limit,
    row_tile,
    rstd_of,
    x_hat_and_g,
)


@triton.jit
def _add_residual(X, R, H, offsets, mask, DTYPE: tl.constexpr):
    # h is stored as the new residual and normalised as rounded: y is rms_norm(new_residual).
    h = (load_tile(X, offsets, mask, DTYPE) + load_tile(R, offsets, mask, DTYPE)).to(
        H.dtype.element_ty
    )
    tl.store(H + offsets, h, mask=mask)
    return h.to(DTYPE)


@triton.jit
def _fwd_kernel(
    X,
    R,
    W,
    Y,
    H,
    RSTD,
    M,
    N,
    eps: tl.float64,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOOPED: tl.constexpr,
):
    DTYPE: tl.constexpr = tl.float64 if X.dtype.element_ty == tl.float64 else tl.float32
    start = tl.program_id(0).to(tl.int64) * BLOCK_M
    rows, cols, offsets, mask = row_tile(start, M, N, BLOCK_M, BLOCK_N)
    w = load_weight(W, cols, N, DTYPE)
    h = _add_residual(X, R, H, offsets, mask, DTYPE)
    sum_sq = tl.sum(h * h, axis=1)
    if LOOPED:  # the other chunks
        for col in range(BLOCK_N, N, BLOCK_N):
            h_c = _add_residual(X, R, H, offsets + col, mask & (cols + col < N)[None, :], DTYPE)
            sum_sq += tl.sum(h_c * h_c, axis=1)
    rstd = rstd_of(sum_sq, N, eps, DTYPE)
    tl.store(Y + offsets, (h * rstd[:, None] * w).to(Y.dtype.element_ty), mask=mask)
    if LOOPED:  # rereads the h each thread stored: one tensor instead of two, already rounded
        normalize_rest(H, W, Y, offsets, cols, mask, rstd, N, DTYPE, BLOCK_N)
    if RSTD is not None:
        tl.store(RSTD + rows, rstd, mask=rows < M)


def fused_add_rms_norm_fwd(
    x: Tensor, residual: Tensor, weight: Tensor | None, eps: float, with_rstd: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(y, new_residual, rstd), or rstd None when with_rstd is False: then not computed."""
    x, residual = x.contiguous(), residual.contiguous()
    weight = weight.contiguous() if weight is not None else None
    y, h = torch.empty_like(x), torch.empty_like(residual)
    return y, h, launch_forward(_fwd_kernel, x, (x, residual, weight, y, h), eps, with_rstd)


def fused_add_rms_norm_(x: Tensor, residual: Tensor, weight: Tensor | None, eps: float) -> None:
    """y written over x and new_residual over residual (both contiguous): the kernel reads each
    element before it writes the same one."""
    weight = weight.contiguous() if weight is not None else None
    launch_forward(_fwd_kernel, x, (x, residual, weight, x, residual), eps, with_rstd=False)


def _backward_launch(n: int, dtype: torch.dtype) -> Launch:
    block_n = triton.next_power_of_2(int(n))  # int(): n is a SymInt when traced
    if block_n > register_row_limit(dtype):
        return Launch(2, 4096, 16, 1)  # wide rows: two at a time, in chunks of 4096
    if block_n <= 4096:  # tiles of 4096 elements on 4 warps, two programs per SM
        return Launch(4096 // block_n, block_n, 4, 2)
    return Launch(1, block_n, 16, 1)  # a row at a time on 16 warps: one program fills an SM


@triton.jit
def _bwd_kernel(
    DY,
    GRES,
    H,
    W,
    RSTD,
    DH,
    DW,
    M,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOOPED: tl.constexpr,
):
    # rms_norm's persistent backward at h, plus GRES: the gradient of h as an output (None: zero).
    DTYPE: tl.constexpr = tl.float64 if H.dtype.element_ty == tl.float64 else tl.float32
    dw_row = tl.program_id(0).to(tl.int64) * N
    dw = tl.zeros([BLOCK_N], dtype=DTYPE)
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK_M, M, tl.num_programs(0) * BLOCK_M):
        rows, cols, offsets, mask = row_tile(start, M, N, BLOCK_M, BLOCK_N)
        rstd = load_tile(RSTD, rows, rows < M, DTYPE)
        h_hat, dy, g = x_hat_and_g(H, DY, W, offsets, cols, mask, rstd, N, DTYPE)
        # Issued with the other loads, not at its use after the reduction: all in flight at once.
        gres = load_tile(GRES, offsets, mask, DTYPE) if GRES is not None else 0.0
        if W is not None:  # before the row sums, so that dy need not outlive them
            dw += tl.sum(dy * h_hat, axis=0)
        dot = tl.sum(h_hat * g, axis=1)
        if LOOPED:
            dot += dot_rest(H, DY, W, offsets, cols, mask, rstd, N, DTYPE, BLOCK_N)
        dh = grad_x(h_hat, g, rstd, dot, N) + gres
        tl.store(DH + offsets, dh.to(DH.dtype.element_ty), mask=mask)
        if LOOPED:  # the other chunks, again
            for col in range(BLOCK_N, N, BLOCK_N):
                mask_c = mask & (cols + col < N)[None, :]
                h_hat_c, dy_c, g_c = x_hat_and_g(
                    H, DY, W, offsets + col, cols + col, mask_c, rstd, N, DTYPE
                )
                gres_c = load_tile(GRES, offsets + col, mask_c, DTYPE) if GRES is not None else 0.0
                if W is not None:
                    add_to_row(DW + dw_row, cols + col, N, tl.sum(dy_c * h_hat_c, axis=0))
                dh_c = grad_x(h_hat_c, g_c, rstd, dot, N) + gres_c
                tl.store(DH + offsets + col, dh_c.to(DH.dtype.element_ty), mask=mask_c)
    if W is not None:
        tl.store(DW + dw_row + tl.arange(0, BLOCK_N), dw, mask=tl.arange(0, BLOCK_N) < N)


def fused_add_rms_norm_bwd(
    grad_y: Tensor,
    grad_new_residual: Tensor | None,
    new_residual: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """(dh, dw): rms_norm's input gradient at new_residual plus grad_new_residual (None: zero), in
    new_residual's dtype; dw as rms_norm_bwd's."""
    grad_y, h, rstd = grad_y.contiguous(), new_residual.contiguous(), rstd.contiguous()
    gres = grad_new_residual.contiguous() if grad_new_residual is not None else None
    weight = weight.contiguous() if weight is not None else None
    dh = torch.empty_like(h)
    c = _backward_launch(h.shape[-1], grad_y.dtype)
    dw = launch_backward(_bwd_kernel, c, h, weight, (grad_y, gres, h, weight, rstd, dh))
    return dh, dw
