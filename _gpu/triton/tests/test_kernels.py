"""The Triton kernels called directly, against the float64 reference: on a GPU, and without one
through Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), where the ops themselves
take the pure-PyTorch path. And on a GPU, that torch.compile runs the kernels themselves."""

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from my_torch_ops import (
    fused_add_rms_norm_kernels,
    rms_norm,
    rms_norm_kernels,
)
from my_torch_ops.fused_add_rms_norm import fused_add_rms_norm_reference
from my_torch_ops.rms_norm import rms_norm_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}
# Short rows several to a program, rows held in registers, rows too wide for them (looped).
SHAPES = [(0, 64), (1, 7), (5, 1000), (3, 4097), (2, 20000)]
DTYPES = [torch.float32, torch.bfloat16, torch.float64]


def close(actual, expected, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    torch.testing.assert_close(actual.double(), expected.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_rms_norm_kernels(shape, dtype, weight):
    x = torch.randn(shape, dtype=dtype, device=DEVICE)
    w = torch.randn(shape[-1], device=DEVICE) if weight else None
    dy = torch.randn_like(x)
    x64 = x.double().requires_grad_()
    w64 = None if w is None else w.double().requires_grad_()
    want = rms_norm_reference(x64, w64)
    want.backward(dy.double())

    y, rstd = rms_norm_kernels.rms_norm_fwd(x, w, 1e-6, with_rstd=True)
    close(y, want, dtype)
    close(rstd, torch.rsqrt(x.double().square().mean(-1) + 1e-6), torch.float32)
    y_only, no_rstd = rms_norm_kernels.rms_norm_fwd(x, w, 1e-6, with_rstd=False)
    assert no_rstd is None and torch.equal(y_only, y)
    dx, dw = rms_norm_kernels.rms_norm_bwd(dy, x, rstd, w)
    close(dx, x64.grad, dtype)
    if w is None:
        assert dw.shape == (0,)
    else:
        assert dw.dtype == w.dtype
        close(dw, w64.grad, w.dtype, scale=max(shape[0], 1) ** 0.5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", [(torch.float32,) * 2, (torch.bfloat16, torch.float32)], ids=str)
@pytest.mark.parametrize("grad_h", [True, False], ids=["grad_h", "no_grad_h"])
def test_fused_add_rms_norm_kernels(shape, dtypes, grad_h):
    x = torch.randn(shape, dtype=dtypes[0], device=DEVICE)
    r = torch.randn(shape, dtype=dtypes[1], device=DEVICE)
    w = torch.randn(shape[-1], device=DEVICE)
    dy, dh = torch.randn_like(x), torch.randn_like(r) if grad_h else None
    x64, r64, w64 = (t.double().requires_grad_() for t in (x, r, w))
    want_y, want_h = fused_add_rms_norm_reference(x64, r64, w64)
    grads = [dy.double(), torch.zeros_like(want_h) if dh is None else dh.double()]
    torch.autograd.backward([want_y, want_h], grads)

    y, h, rstd = fused_add_rms_norm_kernels.fused_add_rms_norm_fwd(x, r, w, 1e-6, with_rstd=True)
    close(h, want_h, dtypes[1])
    close(y, want_y, dtypes[0])
    grad_h, dw = fused_add_rms_norm_kernels.fused_add_rms_norm_bwd(dy, dh, h, rstd, w)
    assert grad_h.dtype == r.dtype
    close(grad_h, r64.grad, dtypes[0])
    close(grad_h.to(x.dtype), x64.grad, dtypes[0])  # x's gradient, as autograd rounds it
    close(dw, w64.grad, w.dtype, scale=max(shape[0], 1) ** 0.5)


@pytest.mark.cuda
def test_compiled_code_runs_the_kernels():
    """triton_op + wrap_triton: Inductor's generated code launches the project's own Triton
    kernels, not an opaque call into Python."""
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    w = torch.randn(1024, device="cuda", requires_grad=True)
    compiled = torch.compile(lambda x, w: rms_norm(x, w).sum(), fullgraph=True)
    _, codes = run_and_get_code(lambda: compiled(x, w).backward())
    code = "\n".join(codes)
    kernels = [name for name in dir(rms_norm_kernels) if name.endswith("_kernel")]
    assert kernels and any(name in code for name in kernels), kernels
    assert "my_torch_ops.rms_norm_fwd" not in code
