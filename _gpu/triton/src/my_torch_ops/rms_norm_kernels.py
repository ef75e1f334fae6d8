"""RMSNorm's Triton kernels, its backward's launch choices and the host functions that launch them:
y = x * rstd * w with rstd = 1 / sqrt(mean(x**2) + eps) over each row of N elements."""

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
    sum_sq_rest,
    x_hat_and_g,
)


@triton.jit
def _fwd_kernel(
    X,
    W,
    Y,
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
    # The weight loads with the rows, not after the reduction, where its latency would show.
    w = load_weight(W, cols, N, DTYPE)
    x = load_tile(X, offsets, mask, DTYPE)
    sum_sq = tl.sum(x * x, axis=1)
    if LOOPED:
        sum_sq += sum_sq_rest(X, offsets, cols, mask, N, DTYPE, BLOCK_N)
    rstd = rstd_of(sum_sq, N, eps, DTYPE)
    tl.store(Y + offsets, (x * rstd[:, None] * w).to(Y.dtype.element_ty), mask=mask)
    if LOOPED:
        normalize_rest(X, W, Y, offsets, cols, mask, rstd, N, DTYPE, BLOCK_N)
    if RSTD is not None:
        tl.store(RSTD + rows, rstd, mask=rows < M)


def rms_norm_fwd(
    x: Tensor, weight: Tensor | None, eps: float, with_rstd: bool
) -> tuple[Tensor, Tensor | None]:
    """(y, rstd), or (y, None) when with_rstd is False: the kernel then computes no rstd."""
    x = x.contiguous()
    weight = weight.contiguous() if weight is not None else None
    y = torch.empty_like(x)
    return y, launch_forward(_fwd_kernel, x, (x, weight, y), eps, with_rstd)


def _backward_launch(n: int, dtype: torch.dtype) -> Launch:
    block_n = triton.next_power_of_2(int(n))  # int(): n is a SymInt when traced
    if block_n > register_row_limit(dtype):
        return Launch(2, 4096, 16, 1)  # wide rows: two at a time, in chunks of 4096
    # Tiles of 8192 elements, two programs per SM, on 4 warps up to rows of 1024 and 8 above
    # (4 warps for the wider rows, or 8 for the shorter, were slower); a row of 16384 fills an SM.
    if block_n <= 8192:
        return Launch(8192 // block_n, block_n, 4 if block_n <= 1024 else 8, 2)
    return Launch(1, block_n, 16, 1)


@triton.jit
def _bwd_kernel(
    DY, X, W, RSTD, DX, DW, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOPED: tl.constexpr
):
    # Persistent: each program takes every num_programs-th block of BLOCK_M rows, sums its share
    # of dw in registers and writes it once, as its row of the partials DW.
    DTYPE: tl.constexpr = tl.float64 if X.dtype.element_ty == tl.float64 else tl.float32
    dw_row = tl.program_id(0).to(tl.int64) * N
    dw = tl.zeros([BLOCK_N], dtype=DTYPE)
    # An int64 loop index: the offsets need it, and converting an int32 one costs registers.
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK_M, M, tl.num_programs(0) * BLOCK_M):
        rows, cols, offsets, mask = row_tile(start, M, N, BLOCK_M, BLOCK_N)
        rstd = load_tile(RSTD, rows, rows < M, DTYPE)
        x_hat, dy, g = x_hat_and_g(X, DY, W, offsets, cols, mask, rstd, N, DTYPE)
        if W is not None:  # before the row sums, so that dy need not outlive them
            dw += tl.sum(dy * x_hat, axis=0)
        dot = tl.sum(x_hat * g, axis=1)
        if LOOPED:
            dot += dot_rest(X, DY, W, offsets, cols, mask, rstd, N, DTYPE, BLOCK_N)
        tl.store(DX + offsets, grad_x(x_hat, g, rstd, dot, N).to(DX.dtype.element_ty), mask=mask)
        if LOOPED:  # the other chunks, again
            for col in range(BLOCK_N, N, BLOCK_N):
                mask_c = mask & (cols + col < N)[None, :]
                x_hat_c, dy_c, g_c = x_hat_and_g(
                    X, DY, W, offsets + col, cols + col, mask_c, rstd, N, DTYPE
                )
                if W is not None:
                    add_to_row(DW + dw_row, cols + col, N, tl.sum(dy_c * x_hat_c, axis=0))
                dx = grad_x(x_hat_c, g_c, rstd, dot, N)
                tl.store(DX + offsets + col, dx.to(DX.dtype.element_ty), mask=mask_c)
    if W is not None:
        tl.store(DW + dw_row + tl.arange(0, BLOCK_N), dw, mask=tl.arange(0, BLOCK_N) < N)


def rms_norm_bwd(
    grad_y: Tensor, x: Tensor, rstd: Tensor, weight: Tensor | None
) -> tuple[Tensor, Tensor]:
    """(dx, dw) for the rstd of rms_norm_fwd; without a weight, dw is an empty float32 tensor."""
    grad_y, x, rstd = grad_y.contiguous(), x.contiguous(), rstd.contiguous()
    weight = weight.contiguous() if weight is not None else None
    dx = torch.empty_like(x)
    c = _backward_launch(x.shape[-1], x.dtype)
    return dx, launch_backward(_bwd_kernel, c, x, weight, (grad_y, x, weight, rstd, dx))
