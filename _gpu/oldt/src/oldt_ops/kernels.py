"""Triton kernels for RMSNorm and fused residual-add RMSNorm, forward and backward.

All launchers take inputs the caller has already validated. All math runs in float32
(float64 where the tensors involved are, so gradcheck is exact); inputs and outputs keep their
dtypes.
The forward holds each row in registers and reads it once, except rms_norm's rows of 2049 to
8192 elements and rows of more than 16384, which it reads twice, the second time from L2; the
backward is a persistent kernel that fuses dx with per-program dw partials, summed afterwards
without atomics.

The fused op (h = x + residual, y = rms_norm(h)) runs through the same kernels: the add
happens as the rows are loaded in the forward and the residual's gradient is added as dx is
stored in the backward, so each direction is still a single pass over memory.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._launch import Launcher

# Rows up to this many elements (after rounding N up to a power of two) can be held in
# registers, so x and grad_y are read from HBM exactly once (the fused backward, which holds a
# third row, up to half as many: see _bwd_config). Wider rows use looped kernels that stream
# each row twice (the second time mostly from L2).
_MAX_FUSED_N = 16384
# Column chunk of the looped backward.
_LOOPED_BLOCK_N = 4096
# rms_norm's forward reads rows of these sizes (after rounding N up to a power of two) in two
# passes with the looped kernel, as it does rows wider than _MAX_FUSED_N, in chunks of at most
# _FWD_MAX_CHUNK (see _fwd_config).
_FWD_TWO_PASS_N = (4096, 8192)
_FWD_MAX_CHUNK = 8192
# Tile of the dw partials reduction: 32 columns a program (64 programs at N = 2048), each
# summing its columns over all partial rows, 64 rows per step. The partials were just
# written and sit in L2: the reduction is bound by load latency, so few, wide steps (on an
# H100, 0.3-0.5 us off the bf16 backward at N <= 4096 against 16 rows a step).
_DW_BLOCK_P, _DW_BLOCK_N = 64, 32


@triton.jit
def _load_input(
    x_ptr,
    res_ptr,
    h_ptr,
    offsets,
    mask,
    HAS_RESIDUAL: tl.constexpr,
    ADD_DTYPE: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
):
    # The rows to normalise: x, or h = x + residual rounded to residual's dtype. h is stored
    # as the new residual and normalised as rounded, so y is exactly rms_norm(new_residual).
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + offsets, mask=mask, other=0.0)
        x = (x.to(ADD_DTYPE) + r.to(ADD_DTYPE)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + offsets, x, mask=mask)
    return x.to(COMPUTE_DTYPE)


@triton.jit
def _store_grads(dh, dx_ptr, dres_ptr, offsets, mask, HAS_RESIDUAL: tl.constexpr):
    # The fused op's x and residual get the same gradient dh, in their own dtypes.
    tl.store(dx_ptr + offsets, dh.to(dx_ptr.dtype.element_ty), mask=mask)
    if HAS_RESIDUAL:
        tl.store(dres_ptr + offsets, dh.to(dres_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    rstd_ptr,
    M,
    N,
    eps: tl.float64,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_RSTD: tl.constexpr,
    ADD_DTYPE: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # int64: the row index (M may reach 2**31) and M * N may exceed int32.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    offsets = rows[:, None] * N + cols[None, :]

    # The weight is loaded with the rows, not after the reduction, where its latency would
    # add to every program's (on an H100, up to 0.04 of copy bandwidth at N <= 4096).
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
    x = _load_input(x_ptr, res_ptr, h_ptr, offsets, mask, HAS_RESIDUAL, ADD_DTYPE, COMPUTE_DTYPE)
    # eps is annotated float64 because a Python float would be passed as float32 and
    # rounded; add it in float64, then narrow to the compute dtype.
    rstd = 1.0 / tl.sqrt((tl.sum(x * x, axis=1) / N + eps).to(COMPUTE_DTYPE))
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        y = y * w.to(COMPUTE_DTYPE)[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    if HAS_RSTD:
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _fwd_looped_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    rstd_ptr,
    N,
    eps: tl.float64,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_RSTD: tl.constexpr,
    ADD_DTYPE: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One program per row: pass 1 sums squares (and stores h), pass 2 rereads the row from L2
    # to write y. Pass 1 loads x under an evict-last policy, so that the row is still in L2
    # for pass 2 while other programs stream theirs, and pass 2 marks it evict-first. (The
    # fused op's pass 1 reads x and residual, dead after it, and pass 2 reads the h it wrote.)
    row = tl.program_id(0)
    row_offset = row.to(tl.int64) * N

    sum_sq = tl.zeros([BLOCK_N], dtype=COMPUTE_DTYPE)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        if HAS_RESIDUAL:
            x = _load_input(
                x_ptr,
                res_ptr,
                h_ptr,
                row_offset + cols,
                cols < N,
                HAS_RESIDUAL,
                ADD_DTYPE,
                COMPUTE_DTYPE,
            )
        else:
            x = tl.load(
                x_ptr + row_offset + cols, mask=cols < N, other=0.0, eviction_policy="evict_last"
            ).to(COMPUTE_DTYPE)
        sum_sq += x * x
    rstd = 1.0 / tl.sqrt((tl.sum(sum_sq, axis=0) / N + eps).to(COMPUTE_DTYPE))
    if HAS_RSTD:
        tl.store(rstd_ptr + row, rstd)

    # The fused op rereads h: one tensor instead of x and residual, and already rounded.
    src_ptr = h_ptr if HAS_RESIDUAL else x_ptr
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(
            src_ptr + row_offset + cols, mask=cols < N, other=0.0, eviction_policy="evict_first"
        ).to(COMPUTE_DTYPE)
        y = x * rstd
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
            y = y * w.to(COMPUTE_DTYPE)
        tl.store(y_ptr + row_offset + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)


@triton.jit
def _bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    grad_h_ptr,
    dx_ptr,
    dres_ptr,
    dw_partial_ptr,
    M,
    N,
    rows_per_program,
    HAS_RESIDUAL: tl.constexpr,
    HAS_GRAD_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # x is the normalised input (the new residual h for the fused op) and grad_h_ptr the
    # gradient reaching h directly (grad_new_residual), added to dx when HAS_GRAD_H.
    # Persistent: each program walks a contiguous range of rows BLOCK_M at a time, keeps its
    # share of dw in registers and writes it once as one row of dw_partial.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    # int64: pid * rows_per_program reaches M, which may exceed int32.
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    if HAS_WEIGHT:
        dw = tl.zeros([BLOCK_N], dtype=COMPUTE_DTYPE)

    for block_start in range(row_start, row_end, BLOCK_M):
        rows = block_start + tl.arange(0, BLOCK_M)
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]

        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        if HAS_GRAD_H:
            # Issued with the other loads (not at its use after the reductions) so that all
            # reads of the block are in flight together.
            grad_h = tl.load(grad_h_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0).to(COMPUTE_DTYPE)
        x_hat = x * rstd[:, None]
        if HAS_WEIGHT:
            # Reloaded per block rather than kept live: it hits L1 and frees registers.
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(COMPUTE_DTYPE)
            g = dy * w[None, :]
            dw += tl.sum(dy * x_hat, axis=0)
        else:
            g = dy
        mean_xg = tl.sum(x_hat * g, axis=1) / N
        dx = rstd[:, None] * (g - x_hat * mean_xg[:, None])
        if HAS_GRAD_H:
            dx += grad_h
        _store_grads(dx, dx_ptr, dres_ptr, offsets, mask, HAS_RESIDUAL)

    if HAS_WEIGHT:
        tl.store(dw_partial_ptr + pid * N + cols, dw, mask=col_mask)


@triton.jit
def _bwd_looped_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    grad_h_ptr,
    dx_ptr,
    dres_ptr,
    dw_partial_ptr,
    M,
    N,
    rows_per_program,
    HAS_RESIDUAL: tl.constexpr,
    HAS_GRAD_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Like _bwd_kernel for rows too wide for registers. Per block of rows, pass 1 reduces
    # x_hat * g over the row in BLOCK_N chunks; pass 2 rereads the chunks to write dx and to
    # add the block's dw into this program's row of dw_partial (zero-initialised and owned
    # by this program alone, so no atomics; it mostly stays in L2). grad_h is only needed in
    # pass 2, so it is read once.
    pid = tl.program_id(0)
    # int64 row indices: row * N may exceed 2**31.
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    if HAS_WEIGHT:
        dw_row = dw_partial_ptr + pid.to(tl.int64) * N

    for block_start in range(row_start, row_end, BLOCK_M):
        rows = block_start + tl.arange(0, BLOCK_M)
        row_mask = rows < row_end
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0).to(COMPUTE_DTYPE)

        sum_xg = tl.zeros([BLOCK_M, BLOCK_N], dtype=COMPUTE_DTYPE)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_mask[:, None] & (cols < N)[None, :]
            offsets = rows[:, None] * N + cols[None, :]
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
            g = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
            if HAS_WEIGHT:
                w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(COMPUTE_DTYPE)
                g = g * w[None, :]
            sum_xg += x * g
        mean_xg = tl.sum(sum_xg, axis=1) * rstd / N

        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_mask[:, None] & (cols < N)[None, :]
            offsets = rows[:, None] * N + cols[None, :]
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
            dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
            if HAS_GRAD_H:
                grad_h = tl.load(grad_h_ptr + offsets, mask=mask, other=0.0).to(COMPUTE_DTYPE)
            x_hat = x * rstd[:, None]
            if HAS_WEIGHT:
                w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(COMPUTE_DTYPE)
                g = dy * w[None, :]
                dw = tl.load(dw_row + cols, mask=cols < N, other=0.0)
                dw += tl.sum(dy * x_hat, axis=0)
                tl.store(dw_row + cols, dw, mask=cols < N)
            else:
                g = dy
            dx = rstd[:, None] * (g - x_hat * mean_xg[:, None])
            if HAS_GRAD_H:
                dx += grad_h
            _store_grads(dx, dx_ptr, dres_ptr, offsets, mask, HAS_RESIDUAL)


@triton.jit
def _dw_reduce_kernel(partial_ptr, dw_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # dw[cols] = sum of the P partial rows, added in the same order on every call, and
    # stored in the weight's dtype: one launch instead of a sum and a cast.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=partial_ptr.dtype.element_ty)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(partial_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask)
    tl.store(dw_ptr + cols, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=col_mask)


class _Config(NamedTuple):
    looped: bool  # one row a program, streamed in block_n chunks and read twice
    block_m: int  # rows per tile
    block_n: int  # columns per tile: the whole row, padded to a power of two, unless looped
    num_warps: int
    programs_per_sm: int  # backward only: size of the persistent grid


# Heuristics below were measured on H100 and H200 GPUs with bf16 (fraction of copy
# bandwidth); they avoid autotuning so the first call is not slow and every call picks its
# config cheaply. The fused forward adds a load and a store per element, but x and residual
# are dead once h is formed, so it holds one row tensor in registers like the plain one, and
# up to _MAX_FUSED_N: read in two passes, its second pass rereads the h the first one wrote,
# and on an H100 that was 1.3-3.1 us slower than the register kernel from 8192x4096 to
# 32768x8192. Swept on its own (H100), the fused forward did best with the register configs
# from N = 2048; at N = 1024 one row per warp would be up to 0.1 faster.
@functools.cache
def _fwd_config(n: int, fused: bool = False) -> _Config:
    block_n = triton.next_power_of_2(n)
    if block_n > _MAX_FUSED_N or (not fused and block_n in _FWD_TWO_PASS_N):
        # Two passes over the row, as torch.compile's kernel reads wide rows: a chunk of half
        # the row (at most _FWD_MAX_CHUNK) at a time, on warps sized for 8 elements a thread.
        # At N = 16384 the register kernel was faster on an H200 (by 3.4-23 us) and slower on
        # an H100 (by 0.5-9.2 us); it stays. Paired timings: docs/performance.md.
        chunk = min(block_n // 2, _FWD_MAX_CHUNK)
        return _Config(True, 1, chunk, chunk // 256, 0)
    # Short rows are stacked until a program moves at least 4096 elements, and rows up to 4096
    # two at a time; warps are sized for 32 elements a thread, at most 8 warps. On an H100,
    # kernels alone, against 16 elements a thread on 8 warps: 4096x1024 0.82-0.85 -> 0.94-0.98
    # of copy bandwidth, 4096x4096 0.93 -> 0.95; more warps only add cross-warp reduction work.
    block_m = max(4096 // block_n, 2 if block_n <= 4096 else 1)
    return _Config(False, block_m, block_n, min(8, max(4, block_m * block_n // 1024)), 0)


@functools.cache
def _bwd_config(n: int, fused: bool = False) -> _Config:
    block_n = triton.next_power_of_2(n)
    # The fused op holds grad_new_residual as a third row tensor. Its configs are not measured
    # but sized from ptxas -v for sm_90 (bf16 and fp32): at 16384 a row no longer fits in
    # registers without spilling, so it goes to the looped kernel from there.
    if block_n > (_MAX_FUSED_N // 2 if fused else _MAX_FUSED_N):
        # Four rows per step amortise the read-modify-write of the dw partial row.
        return _Config(True, 4, _LOOPED_BLOCK_N, 16, 1)
    if fused:
        # Tiles of 4096 elements on 4 warps (half the plain tiles up to N = 2048, a quarter at
        # 4096): 32 elements a thread of each tensor, ~160-220 registers, so still two programs
        # per SM (48 KiB of bf16 rows in flight per SM).
        if block_n <= 4096:
            return _Config(False, 4096 // block_n, block_n, 4, 2)
        # 8192: 8 warps would need ~190 registers and allow one program per SM; 16 warps
        # need under 128, so one 16-warp program fills the SM instead.
        return _Config(False, 1, block_n, 16, 1)
    if block_n <= 1024:
        # Tiles of 8192 elements on 4 warps; two programs per SM keep ~64 KiB of x and
        # grad_y in flight per SM.
        return _Config(False, 8192 // block_n, block_n, 4, 2)
    if block_n <= 4096:
        # Tiles of 16384 elements on 8 warps: on an H100 (kernels alone, dw reduction included)
        # 0.95 of copy bandwidth at 65536x2048 and 0.93 at 32768x4096, against 0.91 for the
        # 8192-element tiles above.
        return _Config(False, 16384 // block_n, block_n, 8, 2)
    # One row per step; at 16384 a 16-warp program fills an SM's register file alone.
    num_warps = block_n // 1024
    return _Config(False, 1, block_n, num_warps, 2 if num_warps <= 8 else 1)


@functools.cache
def _num_sms(device: torch.device) -> int:
    # The interpreter (CPU tensors) has no SMs; a few programs still exercise the row split.
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _acc_dtype(*dtypes: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _tl_dtype(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _cdiv(a: int, b: int) -> int:
    # triton.cdiv also works inside kernels, which makes it a slower call on the host.
    return -(-a // b)


@functools.cache
def _fwd_launcher(
    cfg: _Config, x_dtype, norm_dtype, has_residual: bool, has_weight: bool, has_rstd: bool
) -> Launcher:
    meta = dict(
        HAS_RESIDUAL=has_residual,
        HAS_WEIGHT=has_weight,
        HAS_RSTD=has_rstd,
        ADD_DTYPE=_tl_dtype(_acc_dtype(x_dtype, norm_dtype)),
        COMPUTE_DTYPE=_tl_dtype(norm_dtype),
        BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps,
    )
    if cfg.looped:  # one row per program: no BLOCK_M
        return Launcher(_fwd_looped_kernel, **meta)
    return Launcher(_fwd_kernel, BLOCK_M=cfg.block_m, **meta)


def _norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    eps: float,
    with_rstd: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    # Without rstd (the ops that return none) the kernels neither compute nor store it.
    x = x.contiguous()
    if weight is not None:
        weight = weight.contiguous()
    h = None
    if residual is not None:
        residual = residual.contiguous()
        h = torch.empty_like(residual)
    # The normalised tensor, x or h, sets the compute dtype; the add itself runs in float64
    # when either operand is float64.
    norm_dtype = x.dtype if h is None else h.dtype
    n = x.shape[-1]
    m = x.numel() // n
    y = torch.empty_like(x)
    rstd = x.new_empty(x.shape[:-1], dtype=_acc_dtype(norm_dtype)) if with_rstd else None
    if m == 0:
        return y, h, rstd

    cfg = _fwd_config(n, fused=h is not None)
    launch = _fwd_launcher(cfg, x.dtype, norm_dtype, h is not None, weight is not None, with_rstd)
    if cfg.looped:
        launch((m,), x, residual, weight, y, h, rstd, n, eps)
    else:
        launch((_cdiv(m, cfg.block_m),), x, residual, weight, y, h, rstd, m, n, eps)
    return y, h, rstd


@functools.cache
def _bwd_launcher(
    cfg: _Config, fused: bool, has_grad_h: bool, has_weight: bool, acc_dtype
) -> Launcher:
    return Launcher(
        _bwd_looped_kernel if cfg.looped else _bwd_kernel,
        HAS_RESIDUAL=fused,
        HAS_GRAD_H=has_grad_h,
        HAS_WEIGHT=has_weight,
        COMPUTE_DTYPE=_tl_dtype(acc_dtype),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps,
    )


_dw_reduce = Launcher(_dw_reduce_kernel, BLOCK_P=_DW_BLOCK_P, BLOCK_N=_DW_BLOCK_N)


def _norm_bwd(
    grad_y: torch.Tensor,
    grad_h: torch.Tensor | None,
    x: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    dx_dtype: torch.dtype,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    # x is the normalised tensor (new_residual for the fused op) and grad_h the gradient
    # reaching it directly; fused adds a second output, the residual's gradient in x's dtype.
    # As in the forward's add, the math runs in float64 when x or dx is float64.
    grad_y = grad_y.contiguous()
    x = x.contiguous()
    rstd = rstd.contiguous()
    if grad_h is not None:
        grad_h = grad_h.contiguous()
    if weight is not None:
        weight = weight.contiguous()
    n = x.shape[-1]
    m = x.numel() // n
    dx = torch.empty_like(x, dtype=dx_dtype)
    dres = torch.empty_like(x) if fused else None
    if m == 0:
        if weight is None:
            return dx, dres, x.new_empty(0, dtype=torch.float32)
        return dx, dres, torch.zeros_like(weight)

    cfg = _bwd_config(n, fused)
    # Split the rows evenly over the persistent grid in whole BLOCK_M blocks, and drop the
    # programs that would get none (small M).
    num_blocks = _cdiv(m, cfg.block_m)
    max_programs = _num_sms(x.device) * cfg.programs_per_sm
    rows_per_program = _cdiv(num_blocks, max_programs) * cfg.block_m
    num_programs = _cdiv(m, rows_per_program)

    acc_dtype = _acc_dtype(x.dtype, dx_dtype)
    dw_partial = None
    if weight is not None:
        # The looped kernel adds into its row, so it must start at zero.
        alloc = x.new_zeros if cfg.looped else x.new_empty
        dw_partial = alloc((num_programs, n), dtype=acc_dtype)
    launch = _bwd_launcher(cfg, fused, grad_h is not None, weight is not None, acc_dtype)
    grid = (num_programs,)
    launch(grid, grad_y, x, weight, rstd, grad_h, dx, dres, dw_partial, m, n, rows_per_program)
    if weight is None:
        return dx, dres, x.new_empty(0, dtype=torch.float32)
    dw = torch.empty_like(weight)
    _dw_reduce((_cdiv(n, _DW_BLOCK_N),), dw_partial, dw, num_programs, n)
    return dx, dres, dw


def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return y = x * rstd * weight and rstd = 1 / sqrt(mean(x**2, -1) + eps)."""
    y, _, rstd = _norm_fwd(x, None, weight, eps)
    return y, rstd


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Return y as rms_norm_fwd does, without rstd (for calls that need no gradient)."""
    return _norm_fwd(x, None, weight, eps, with_rstd=False)[0]


def rms_norm_bwd(
    grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (dx, dw) for the rstd saved by rms_norm_fwd.

    dw has weight's dtype; without a weight it is an empty float32 tensor.
    """
    dx, _, dw = _norm_bwd(grad_y, None, x, rstd, weight, x.dtype, fused=False)
    return dx, dw


def fused_add_rms_norm_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (y, new_residual, rstd) in one pass over x and residual.

    new_residual = x + residual, rounded to residual's dtype; (y, rstd) are
    rms_norm_fwd(new_residual, weight, eps), with y in x's dtype.
    """
    return _norm_fwd(x, residual, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (y, new_residual) as fused_add_rms_norm_fwd does, without rstd."""
    y, h, _ = _norm_fwd(x, residual, weight, eps, with_rstd=False)
    return y, h


def fused_add_rms_norm_bwd(
    grad_y: torch.Tensor,
    grad_new_residual: torch.Tensor | None,
    new_residual: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    x_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (dx, dresidual, dw) for the outputs of fused_add_rms_norm_fwd.

    dx and dresidual are both rms_norm's input gradient plus grad_new_residual (None counts
    as zero), in x_dtype and new_residual's dtype, as two separate tensors. dw is as in
    rms_norm_bwd.
    """
    return _norm_bwd(grad_y, grad_new_residual, new_residual, rstd, weight, x_dtype, fused=True)
