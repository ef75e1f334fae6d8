"""RMSNorm ops against the float64 reference: values, gradients, opcheck and torch.compile.

Every test runs on CPU, and on CUDA when a GPU is present (skipped, with the reason, otherwise).
"""

import pytest
import torch
{%- if cookiecutter.variant == 'triton' %}
from torch._inductor.utils import run_and_get_code
{%- endif %}
from torch.library import opcheck

from {{ cookiecutter.package_name }} import rms_norm{% if cookiecutter.variant == 'triton' %}, rms_norm_kernels{% endif %}
from {{ cookiecutter.package_name }}.rms_norm import rms_norm_reference

OPS = torch.ops.{{ cookiecutter.package_name }}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Outputs are rounded once from float32 math: allow about two units in the last place.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}
SHAPES = [(1, 7), (4, 1000), (3, 4096), (5, 8193), (2, 3, 96), (65, 128)]
# Shapes the CUDA kernels launch differently (see test_few_and_many_rows).
GPU_SHAPES = [
    (1, 4096),
    (256, 4096),
    (4096, 4096),
    (8192, 1024),
    (4096, 1024),
    (20000, 2048),
    (8192, 4096),
    (300, 8192),
    (64, 20000),
    (300, 4100),
    (2000, 127),
]
WEIGHTS = ["none", "same", "float32"]


def make_weight(kind, n, dtype, device, requires_grad=False):
    if kind == "none":
        return None
    w_dtype = dtype if kind == "same" else torch.float32
    return torch.randn(n, dtype=w_dtype, device=device, requires_grad=requires_grad)


def poison_cache(device, numel):
    """Leaves NaN-filled blocks in the CUDA caching allocator, so an output element that a kernel
    forgets to write shows up as NaN instead of as a stale correct value."""
    if device == "cuda":
        for _ in range(4):
            torch.full((numel,), float("nan"), device=device)


def assert_close(actual, expected, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=tol, rtol=tol)


def ref64(x, w, eps=1e-6):
    return rms_norm_reference(x.double(), None if w is None else w.double(), eps)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight", WEIGHTS)
def test_forward(device, shape, dtype, weight):
    check_forward(device, shape, dtype, weight)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight", WEIGHTS)
def test_backward(device, shape, dtype, weight):
    check_backward(device, shape, dtype, weight)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_few_and_many_rows(shape, dtype):
    """The GPU kernels launch differently for a few rows (decode sizes), many rows, a grid just
    over one wave of blocks (8192x1024), short rows several to a block (4096x1024) and over
    several waves (20000x2048), wide rows held in registers (300x8192), rows too wide for them
    (64x20000) and rows of an odd width (2000x127): all against float64, with a float32 and a
    16-bit weight."""
    check_forward("cuda", shape, dtype, "float32")
    check_forward("cuda", shape, dtype, "same")
    check_backward("cuda", shape, dtype, "same")


def check_forward(device, shape, dtype, weight):
    x = torch.randn(shape, dtype=dtype, device=device)
    w = make_weight(weight, shape[-1], dtype, device)
    poison_cache(device, x.numel())
    y, rstd = OPS.rms_norm_fwd(x, w, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    assert rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    assert_close(y, ref64(x, w), dtype)
    expected_rstd = torch.rsqrt(x.double().square().mean(-1) + 1e-6)
    torch.testing.assert_close(rstd.double(), expected_rstd, atol=1e-5, rtol=1e-5)
    # The forward without rstd (calls that need no gradient) writes the same y.
    assert torch.equal(OPS.rms_norm(x, w, 1e-6), y)
    assert_close(rms_norm(x, w), ref64(x, w), dtype)


def check_backward(device, shape, dtype, weight):
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    w = make_weight(weight, shape[-1], dtype, device, requires_grad=True)
    dy = torch.randn(shape, dtype=dtype, device=device)
    poison_cache(device, x.numel())
    rms_norm(x, w).backward(dy)

    x64 = x.detach().double().requires_grad_()
    w64 = None if w is None else w.detach().double().requires_grad_()
    ref64(x64, w64).backward(dy.double())
    assert x.grad.dtype == dtype
    assert_close(x.grad, x64.grad, dtype)
    if w is not None:
        assert w.grad.dtype == w.dtype
        # dw sums over the rows: scale the tolerance with their count.
        rows = x.numel() // shape[-1]
        tol = TOL[dtype] * rows**0.5
        torch.testing.assert_close(w.grad.double(), w64.grad, atol=tol, rtol=TOL[dtype])


@pytest.mark.parametrize("layout", ["transposed", "offset", "strided"])
def test_non_contiguous(device, layout):
    m, n = 33, 257
    if layout == "transposed":
        x = torch.randn(n, m, device=device).t()
    elif layout == "offset":  # data pointer not 16-byte aligned
        x = torch.randn(m * n + 1, device=device)[1:].view(m, n)
    else:
        x = torch.randn(m, 2 * n, device=device)[:, ::2]
    x.requires_grad_()
    w = torch.randn(n, device=device, requires_grad=True)
    dy = torch.randn(n, m, device=device).t()
    y = rms_norm(x, w)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = ref64(x64, w64)
    y64.backward(dy.double())
    assert_close(y, y64, torch.float32)
    assert_close(x.grad, x64.grad, torch.float32)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-4, rtol=1e-5)


def test_rstd_needs_no_gradient(device):
    # rstd is saved for the backward, not differentiated: autograd fills no zero gradient for it.
    x = torch.randn(3, 17, device=device, requires_grad=True)
    y, rstd = OPS.rms_norm_fwd(x, None, 1e-6)
    assert y.requires_grad and not rstd.requires_grad


@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_gradcheck(device, weight):
    x = torch.randn(3, 17, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(17, dtype=torch.float64, device=device, requires_grad=True) if weight else None
    assert torch.autograd.gradcheck(rms_norm, (x, w, 1e-6), check_forward_ad=True)


def test_jvp(device):
    # The ops have backward formulas only: under forward-mode AD (gradcheck above uses dual
    # tensors; torch.func.jvp wraps them in a transform) the API runs the reference.
    x, t = (torch.randn(3, 17, dtype=torch.float64, device=device) for _ in range(2))
    _, got = torch.func.jvp(rms_norm, (x,), (t,))
    _, want = torch.func.jvp(rms_norm_reference, (x,), (t,))
    assert got.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_torch_func_grad_raises(device):
    # torch.func transforms cannot differentiate through an op's registered autograd: they raise
    # (torch's message, which does not name the op), never return a wrong gradient. Differentiate
    # rms_norm_reference with them instead.
    x = torch.randn(3, 17, dtype=torch.float64, device=device)
    with pytest.raises(RuntimeError):
        torch.func.grad(lambda x: rms_norm(x).square().sum())(x)


def test_second_derivative_is_a_clear_error(device):
    # The gradient itself, taken with create_graph=True, is right; differentiating it raises
    # instead of leaving the second derivative silently wrong.
    x = torch.randn(3, 17, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(17, dtype=torch.float64, device=device, requires_grad=True)
    (dx,) = torch.autograd.grad(rms_norm(x, w).square().sum(), x, create_graph=True)
    (want,) = torch.autograd.grad(rms_norm_reference(x, w).square().sum(), x)
    torch.testing.assert_close(dx.detach(), want)
    match = f"{OPS.name}::rms_norm_bwd has no derivative"
    with pytest.raises(RuntimeError, match=match):
        dx.square().sum().backward()


def sample_inputs(device):
    """(x, weight, eps) for opcheck: ranks, dtypes, a float32 weight on bf16 x, strides, with and
    without requires_grad."""
    bf16 = torch.bfloat16
    cases = [
        (torch.randn(8, 64), torch.randn(64), 1e-6),
        (torch.randn(2, 3, 40, dtype=bf16), None, 1e-5),
        (torch.randn(5, 33, dtype=bf16), torch.randn(33), 1e-6),
        (torch.randn(48, 16).t(), torch.randn(48), 1e-6),
    ]
    for requires_grad in (False, True):
        for x, w, eps in cases:
            x = x.to(device).requires_grad_(requires_grad)
            w = None if w is None else w.to(device).requires_grad_(requires_grad)
            yield x, w, eps


CASES = range(len(list(sample_inputs("cpu"))))


@pytest.mark.parametrize("case", CASES)
def test_opcheck_fwd(device, case):
    x, w, eps = list(sample_inputs(device))[case]
    opcheck(OPS.rms_norm_fwd.default, (x, w, eps))


@pytest.mark.parametrize("case", CASES)
def test_opcheck_fwd_without_rstd(device, case):
    # The forward for calls that need no gradient: its inputs do not require grad.
    x, w, eps = list(sample_inputs(device))[case]
    opcheck(OPS.rms_norm.default, (x.detach(), None if w is None else w.detach(), eps))


@pytest.mark.parametrize("case", CASES)
def test_opcheck_bwd(device, case):
    x, w, eps = list(sample_inputs(device))[case]
    x = x.detach()
    w = None if w is None else w.detach()
    _, rstd = OPS.rms_norm_fwd(x, w, eps)
    dy = torch.randn_like(x)
    opcheck(OPS.rms_norm_bwd.default, (dy, x, rstd, w))


def loss_fn(x, w):
    return (rms_norm(x, w) * 2.0).sum()


@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_compile_fullgraph_dynamic(device, weight):
    # Other tests in this process may have compiled loss_fn: all its graphs count toward one
    # recompile limit, so start from none.
    torch.compiler.reset()
    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=True)
    for shape in [(4, 64), (7, 96), (2, 5, 128)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        w = torch.randn(shape[-1], device=device, requires_grad=True) if weight else None
        loss = compiled(x, w)
        loss.backward()
        x_ref = x.detach().requires_grad_()
        w_ref = None if w is None else w.detach().requires_grad_()
        loss_ref = loss_fn(x_ref, w_ref)
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref, atol=1e-3, rtol=1e-5)
        torch.testing.assert_close(x.grad, x_ref.grad)
        if w is not None:
            torch.testing.assert_close(w.grad, w_ref.grad, atol=1e-4, rtol=1e-5)


def test_no_graph_breaks(device):
    x = torch.randn(6, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    explanation = torch._dynamo.explain(loss_fn)(x, w)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
{%- if cookiecutter.variant == 'triton' %}


# The Triton kernels called directly: without a GPU, these are the tests that run them (see
# kernel_device in conftest.py). Short rows several to a program, rows held in registers, rows
# too wide for them (looped).
KERNEL_SHAPES = [(0, 64), (1, 7), (5, 1000), (3, 4097), (2, 20000)]


@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_kernels(kernel_device, shape, dtype, weight):
    x = torch.randn(shape, dtype=dtype, device=kernel_device)
    w_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # the math's dtype
    w = torch.randn(shape[-1], dtype=w_dtype, device=kernel_device) if weight else None
    dy = torch.randn_like(x)
    x64 = x.double().requires_grad_()
    w64 = None if w is None else w.double().requires_grad_()
    want = rms_norm_reference(x64, w64)
    want.backward(dy.double())

    y, rstd = rms_norm_kernels.rms_norm_fwd(x, w, 1e-6, with_rstd=True)
    assert_close(y, want, dtype)
    assert_close(rstd, torch.rsqrt(x.double().square().mean(-1) + 1e-6), torch.float32)
    y_only, no_rstd = rms_norm_kernels.rms_norm_fwd(x, w, 1e-6, with_rstd=False)
    assert no_rstd is None and torch.equal(y_only, y)
    dx, dw = rms_norm_kernels.rms_norm_bwd(dy, x, rstd, w)
    assert_close(dx, x64.grad, dtype)
    if w is None:
        assert dw.shape == (0,)
    else:  # a sum over rows: its error grows with their number
        tol = TOL[w.dtype] * max(shape[0], 1) ** 0.5
        assert dw.dtype == w.dtype
        torch.testing.assert_close(dw.double(), w64.grad, atol=tol, rtol=tol)


@pytest.mark.cuda
def test_compiled_code_runs_the_kernels():
    """triton_op + wrap_triton: Inductor's generated code launches this op's own Triton kernels,
    not an opaque call into Python."""
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    w = torch.randn(1024, device="cuda", requires_grad=True)
    compiled = torch.compile(lambda x, w: rms_norm(x, w).sum(), fullgraph=True)
    _, codes = run_and_get_code(lambda: compiled(x, w).backward())
    code = "\n".join(codes)
    kernels = [name for name in dir(rms_norm_kernels) if name.endswith("_kernel")]
    assert kernels and all(name in code for name in kernels), kernels
    assert "{{ cookiecutter.package_name }}.rms_norm_fwd" not in code
{%- endif %}
