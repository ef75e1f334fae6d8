"""rms_norm: the checks of every op (op_tests.py) on its samples, and what is particular to it:
rstd, forward-mode AD, second derivatives{% if cookiecutter.variant == 'triton' %}, its Triton kernels called directly{% endif %}.

Every test runs on CPU, and on CUDA when a GPU is present (skipped, with the reason, otherwise).
"""

import pytest
import torch
from op_tests import {% if cookiecutter.variant == 'triton' %}TOL, {% endif %}BadCall, DifferentiableOpTests, Sample{% if cookiecutter.variant == 'triton' %}, assert_close{% endif %}
{%- if cookiecutter.variant == 'triton' %}
from torch._inductor.utils import run_and_get_code
{%- endif %}

from {{ cookiecutter.package_name }} import rms_norm{% if cookiecutter.variant == 'triton' %}, rms_norm_kernels{% endif %}
from {{ cookiecutter.package_name }}.rms_norm import rms_norm_reference

OPS = torch.ops.{{ cookiecutter.package_name }}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
F32 = torch.float32
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


def make_weight(kind, n, dtype, device):
    if kind == "none":
        return None
    return torch.randn(n, dtype=dtype if kind == "same" else torch.float32, device=device)


class TestRmsNorm(DifferentiableOpTests):
    function = staticmethod(rms_norm)
    reference = staticmethod(rms_norm_reference)
    namespace = OPS.name
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    # Under forward-mode AD the function runs the reference (see rms_norm).
    check_forward_ad = True

    def samples(self, device, dtype):
        """Each shape with no weight, a weight of x's dtype and a float32 one; on a GPU, the
        shapes the CUDA kernels launch differently; and x not contiguous."""
        shapes = SHAPES + (GPU_SHAPES if device == "cuda" else [])
        for shape in shapes:
            for weight in WEIGHTS:
                x = torch.randn(shape, dtype=dtype, device=device)
                yield Sample((x, make_weight(weight, shape[-1], dtype, device), 1e-6))
        m, n = 33, 257
        for x in (
            torch.randn(n, m, dtype=dtype, device=device).t(),  # transposed
            torch.randn(m * n + 1, dtype=dtype, device=device)[1:].view(m, n),  # not aligned
            torch.randn(m, 2 * n, dtype=dtype, device=device)[:, ::2],  # strided rows
        ):
            yield Sample((x, torch.randn(n, device=device), 1e-6))

    def gradcheck_samples(self, device):
        """Ranks, dtypes, eps, a float32 weight on bf16 x, strides; gradcheck takes them in
        float64."""
        bf16 = torch.bfloat16
        yield Sample((torch.randn(3, 17, device=device), torch.randn(17, device=device), 1e-6))
        yield Sample((torch.randn(3, 17, device=device), None, 1e-6))
        yield Sample((torch.randn(2, 3, 40, dtype=bf16, device=device), None, 1e-5))
        yield Sample(
            (torch.randn(5, 33, dtype=bf16, device=device), torch.randn(33, device=device), 1e-6)
        )
        yield Sample((torch.randn(48, 16, device=device).t(), torch.randn(48, device=device), 1e-6))

    def bad_calls(self):
        def call(x_shape, x_dtype=F32, w_shape=None, w_dtype=F32, eps=1e-6):
            def make(device):
                x = torch.ones(x_shape, device=device).to(x_dtype)
                w = None if w_shape is None else torch.ones(w_shape, device=device).to(w_dtype)
                return Sample((x, w, eps))

            return make

        return [
            BadCall(
                call((4, 4096), w_shape=(4095,)), ValueError, r"weight must have shape \(4096,\)"
            ),
            BadCall(call((4, 8), w_shape=(2, 8)), ValueError, r"weight must have shape \(8,\)"),
            *[
                BadCall(call((4, 8), dtype), TypeError, f"x must be float32.*got {dtype}$")
                for dtype in (torch.int32, torch.bool, torch.complex64, torch.float8_e4m3fn)
            ],
            BadCall(
                call((4, 8), w_shape=(8,), w_dtype=torch.int64),
                TypeError,
                "weight must be float32.*got torch.int64$",
            ),
            BadCall(call(()), ValueError, "x must have at least 1 dimension"),
            BadCall(call((4, 0)), ValueError, r"non-empty last dimension, got shape \(4, 0\)"),
            *[
                BadCall(call((4, 8), eps=eps), TypeError, "eps must be a float")
                for eps in ("1e-6", None, True, torch.ones(2))
            ],
            *[
                BadCall(call((4, 8), eps=eps), ValueError, "eps must be >= 0")
                for eps in (-1e-6, float("nan"))
            ],
        ]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rstd(device, dtype):
    # What the forward saves for the backward: 1 / sqrt(mean(x**2) + eps) per row, in float32.
    x = torch.randn(5, 3, 96, dtype=dtype, device=device)
    _, rstd = OPS.rms_norm_fwd(x, None, 1e-6)
    assert rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    expected_rstd = torch.rsqrt(x.double().square().mean(-1) + 1e-6)
    torch.testing.assert_close(rstd.double(), expected_rstd, atol=1e-5, rtol=1e-5)


def test_rstd_needs_no_gradient(device):
    # rstd is saved for the backward, not differentiated: autograd fills no zero gradient for it.
    x = torch.randn(3, 17, device=device, requires_grad=True)
    y, rstd = OPS.rms_norm_fwd(x, None, 1e-6)
    assert y.requires_grad and not rstd.requires_grad


def test_jvp(device):
    # The ops have backward formulas only: under forward-mode AD (gradcheck in TestRmsNorm uses dual
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
    assert_close(y, want, TOL[dtype])
    assert_close(rstd, torch.rsqrt(x.double().square().mean(-1) + 1e-6), TOL[torch.float32])
    y_only, no_rstd = rms_norm_kernels.rms_norm_fwd(x, w, 1e-6, with_rstd=False)
    assert no_rstd is None and torch.equal(y_only, y)
    dx, dw = rms_norm_kernels.rms_norm_bwd(dy, x, rstd, w)
    assert_close(dx, x64.grad, TOL[dtype])
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
