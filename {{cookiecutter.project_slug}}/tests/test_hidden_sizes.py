"""The shipped ops, forward and backward, at the hidden sizes of widely used models and at odd
sizes around the kernels' launch limits, in float32, float16 and bfloat16, with and without a
weight, against the float64 reference. Each size runs in a fresh process, so no launch can pass
only because an earlier one left the GPU configured for it."""

import subprocess
import sys

import pytest
import torch

from {{ cookiecutter.package_name }} import fused_add_rms_norm, fused_add_rms_norm_, rms_norm
from {{ cookiecutter.package_name }}.fused_add_rms_norm import fused_add_rms_norm_reference
from {{ cookiecutter.package_name }}.rms_norm import rms_norm_reference

MODEL_SIZES = [768, 1024, 2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192, 11008, 12288, 13824]
MODEL_SIZES += [14336, 16384, 18432, 28672]
# One element either side of the sizes where the kernels change how they hold a row.
ODD_SIZES = [n + d for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536) for d in (-1, 1)]
# Rows that start 2, 4 or 8 elements aligned: loads narrower than 16 bytes, or single elements.
ALIGN_SIZES = [4098, 4100, 4104, 18436]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def close(actual, expected, dtype, rows=1):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=tol * rows**0.5, rtol=tol)


def check_size(n: int) -> None:
    """All ops at rows of n on the GPU, against float64."""
    for dtype in DTYPES:
        for with_weight in (True, False):
            x = torch.randn(8, n, device="cuda", dtype=dtype, requires_grad=True)
            r = torch.randn(8, n, device="cuda", dtype=dtype, requires_grad=True)
            w = (torch.rand(n, device="cuda", dtype=dtype) + 0.5).requires_grad_(with_weight)
            w = w if with_weight else None
            dy = torch.randn_like(x)
            x64, r64 = (t.detach().double().requires_grad_() for t in (x, r))
            w64 = None if w is None else w.detach().double().requires_grad_()

            y = rms_norm(x, w)
            y.backward(dy)
            want = rms_norm_reference(x64, w64)
            want.backward(dy.double())
            close(y, want, dtype)
            close(x.grad, x64.grad, dtype)
            if w is not None:
                close(w.grad, w64.grad, dtype, rows=8)
            with torch.no_grad():
                close(rms_norm(x, w), want, dtype)

            for t in (x, r, w, x64, r64, w64):
                if t is not None:
                    t.grad = None
            y, h = fused_add_rms_norm(x, r, w)
            torch.autograd.backward([y, h], [dy, dy])
            want_y, want_h = fused_add_rms_norm_reference(x64, r64, w64)
            torch.autograd.backward([want_y, want_h], [dy.double(), dy.double()])
            close(h, want_h, dtype)
            close(y, want_y, dtype)
            close(x.grad, x64.grad, dtype)
            close(r.grad, r64.grad, dtype)
            if w is not None:
                close(w.grad, w64.grad, dtype, rows=8)

            with torch.no_grad():  # the in-place form writes the same bits into its inputs
                y, h = fused_add_rms_norm(x, r, w)
                x_, r_ = x.clone(), r.clone()
                fused_add_rms_norm_(x_, r_, w)
                assert torch.equal(x_, y) and torch.equal(r_, h)
    torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.parametrize("n", sorted(set(MODEL_SIZES + ODD_SIZES + ALIGN_SIZES)))
def test_hidden_size_in_a_fresh_process(n):
    run = subprocess.run(
        [sys.executable, __file__, str(n)], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


if __name__ == "__main__":
    torch.manual_seed(0)
    check_size(int(sys.argv[1]))
