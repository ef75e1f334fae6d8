"""What both ops' kernels share: launch choices, the host functions that launch, Triton blocks.

A program takes BLOCK_M rows at a time, in chunks of BLOCK_N columns. A row that fits in one chunk
is held in registers; a wider one (LOOPED) keeps its first chunk there and rereads the others,
mostly from L2 (the *_rest blocks). Math runs in DTYPE: float64 for float64 tensors, else float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import compute_dtype


class Launch(NamedTuple):
    """A kernel's launch choice, from N, the dtype and the SM count: data, not autotuned."""

    block_m: int  # rows a program takes at a time
    block_n: int  # columns per chunk: the whole row, padded to a power of two, when it fits
    num_warps: int
    programs_per_sm: int = 0  # backward: the size of the persistent grid

    def meta(self, n: int) -> dict:
        return dict(
            BLOCK_M=self.block_m,
            BLOCK_N=self.block_n,
            LOOPED=n > self.block_n,
            num_warps=self.num_warps,
        )


def register_row_limit(dtype: torch.dtype) -> int:
    # Widest row (padded) a program holds in registers; float64 math needs twice the registers.
    return 8192 if dtype == torch.float64 else 16384


def forward_launch(n: int, dtype: torch.dtype) -> Launch:
    """Both ops' forward (the fused op's x and residual are dead once h is formed)."""
    block_n = triton.next_power_of_2(int(n))  # int(): n is a SymInt when traced
    if block_n > register_row_limit(dtype):
        chunk = min(block_n // 2, 8192)
        return Launch(1, chunk, chunk // 256)  # 8 elements a thread
    # Short rows are stacked until a program moves 4096 elements. A thread holds 128 bytes of
    # them in 16-bit types; wider types keep 64, as at 128 their long rows get too few warps to
    # keep loads in flight. At most 8 warps (16 for 4-byte inputs): more only add reduction work.
    block_m = max(4096 // block_n, 2 if block_n <= 4096 else 1)
    thread_bytes = 128 if dtype.itemsize <= 2 else 64
    warps = max(4, block_m * block_n * dtype.itemsize // (32 * thread_bytes))
    return Launch(block_m, block_n, min(warps, 8 if dtype.itemsize <= 2 else 16))


def wrap(kernel):
    """torch.library.wrap_triton(kernel), so that torch.compile sees the kernel itself; under
    Triton's interpreter (the CPU tests) the kernel as it is (torch < 2.13 refuses to wrap it)."""
    return torch.library.wrap_triton(kernel) if isinstance(kernel, triton.JITFunction) else kernel


def launch_forward(kernel, x: Tensor, args: tuple, eps: float, with_rstd: bool) -> Tensor | None:
    """kernel(*args, RSTD, M, N, eps), a program per BLOCK_M of x's rows. Returns RSTD, each row's
    rstd, or None when with_rstd is False (the kernel then computes none)."""
    m, n = x.numel() // x.shape[-1], x.shape[-1]
    rstd = x.new_empty(x.shape[:-1], dtype=compute_dtype(x)) if with_rstd else None
    if m > 0:
        c = forward_launch(n, x.dtype)
        wrap(kernel)[(triton.cdiv(m, c.block_m),)](*args, rstd, m, n, eps, **c.meta(n))
    return rstd


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def launch_backward(kernel, c: Launch, x: Tensor, weight: Tensor | None, args: tuple) -> Tensor:
    """kernel(*args, DW, M, N) on a persistent grid over x's rows, each program summing its share
    of dw into its own row of DW; returns dw, those rows added in a fixed order (deterministic)."""
    m, n = x.numel() // x.shape[-1], x.shape[-1]
    # Up to c.programs_per_sm programs per SM, but no more than it takes to give each the same
    # number of blocks (fewer rows to add). Off CUDA, a few programs still exercise the split.
    sms = 4 if x.device.type != "cuda" else _sm_count(x.device.index or 0)
    blocks = triton.cdiv(m, c.block_m)
    programs = triton.cdiv(blocks, max(1, triton.cdiv(blocks, sms * c.programs_per_sm)))
    partials = None
    if weight is not None:  # a LOOPED kernel adds its rows' other chunks in: those start at zero
        alloc = torch.zeros if n > c.block_n else torch.empty
        partials = alloc(programs, n, dtype=compute_dtype(x), device=x.device)
    if m > 0:
        wrap(kernel)[(programs,)](*args, partials, m, n, **c.meta(n))
    if weight is None:
        return x.new_empty(0, dtype=torch.float32)
    dw = torch.empty_like(weight)
    # The partials were just written and sit in L2: few, wide steps hide the load latency.
    wrap(_sum_rows_kernel)[(triton.cdiv(n, 32),)](partials, dw, programs, n, BLOCK_P=64, BLOCK_N=32)
    return dw


@triton.jit
def row_tile(start, end, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows start.. (before end), columns, offsets (int64: M * N may exceed 2**31), mask."""
    rows = start + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < end)[:, None] & (cols < N)[None, :]
    return rows, cols, rows[:, None] * N + cols[None, :], mask


@triton.jit
def load_tile(ptr, offsets, mask, DTYPE: tl.constexpr):
    # Masked-off elements load as 0, which adds nothing to the row sums.
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(DTYPE)


@triton.jit
def load_weight(W, cols, N, DTYPE: tl.constexpr):
    # Without a weight (None) rows are scaled by 1, which the compiler folds away.
    return 1.0 if W is None else load_tile(W, cols, cols < N, DTYPE)


@triton.jit
def rstd_of(sum_sq, N, eps: tl.float64, DTYPE: tl.constexpr):
    # eps is float64 (a Python float would be passed as float32, rounded): add it, then narrow.
    return 1.0 / tl.sqrt((sum_sq / N + eps).to(DTYPE))


@triton.jit
def sum_sq_rest(X, offsets, cols, mask, N, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row sums of x * x over the chunks after the first."""
    acc = tl.zeros(offsets.shape, dtype=DTYPE)  # summed once at the end, not a reduction a chunk
    for col in range(BLOCK_N, N, BLOCK_N):
        x = load_tile(X, offsets + col, mask & (cols + col < N)[None, :], DTYPE)
        acc += x * x
    return tl.sum(acc, axis=1)


@triton.jit
def normalize_rest(
    X, W, Y, offsets, cols, mask, rstd, N, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr
):
    """y = x * rstd * w over the chunks after the first."""
    for col in range(BLOCK_N, N, BLOCK_N):
        mask_c = mask & (cols + col < N)[None, :]
        w = load_weight(W, cols + col, N, DTYPE)
        y = load_tile(X, offsets + col, mask_c, DTYPE) * rstd[:, None] * w
        tl.store(Y + offsets + col, y.to(Y.dtype.element_ty), mask=mask_c)


@triton.jit
def x_hat_and_g(X, DY, W, offsets, cols, mask, rstd, N, DTYPE: tl.constexpr):
    """For a chunk of rows of y = x * rstd * w: x_hat = x * rstd, dy, and g = dy * w."""
    dy = load_tile(DY, offsets, mask, DTYPE)
    x_hat = load_tile(X, offsets, mask, DTYPE) * rstd[:, None]
    return x_hat, dy, dy * load_weight(W, cols, N, DTYPE)


@triton.jit
def dot_rest(X, DY, W, offsets, cols, mask, rstd, N, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row sums of x_hat * g over the chunks after the first."""
    acc = tl.zeros(offsets.shape, dtype=DTYPE)
    for col in range(BLOCK_N, N, BLOCK_N):
        mask_c = mask & (cols + col < N)[None, :]
        x_hat, _, g = x_hat_and_g(X, DY, W, offsets + col, cols + col, mask_c, rstd, N, DTYPE)
        acc += x_hat * g
    return tl.sum(acc, axis=1)


@triton.jit
def grad_x(x_hat, g, rstd, dot, N):
    """dx = rstd * (g - x_hat * mean(x_hat * g)) for y = x * rstd * w; dot = sum(x_hat * g)."""
    return rstd[:, None] * (g - x_hat * (dot / N)[:, None])


@triton.jit
def add_to_row(row_ptr, cols, N, values):
    # A program's own row of dw partials: no other program touches it, so no atomics.
    tl.store(row_ptr + cols, tl.load(row_ptr + cols, mask=cols < N) + values, mask=cols < N)


@triton.jit
def _sum_rows_kernel(partial_ptr, out_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # Adds the P partial rows in the same order on every call, and casts, in one launch.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=partial_ptr.dtype.element_ty)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & (cols < N)[None, :]
        acc += tl.load(partial_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < N)
