"""fused_add_rms_norm and its in-place form fused_add_rms_norm_: the checks of every op
(op_tests.py) on their samples, and what is particular to them: the unfused composition, gradient
through one output, the in-place form writing what the other returns, and the calls it refuses.
"""

import pytest
import torch
from conftest import ops_error
from op_tests import TOL, BadCall, DifferentiableOpTests, InferenceOpTests, Sample

{% if cookiecutter.variant == 'triton' -%}
from {{ cookiecutter.package_name }} import (
    fused_add_rms_norm,
    fused_add_rms_norm_,
    fused_add_rms_norm_kernels,
    rms_norm,
)
{% else -%}
from {{ cookiecutter.package_name }} import fused_add_rms_norm, fused_add_rms_norm_, rms_norm
{% endif -%}
from {{ cookiecutter.package_name }}._checks import check_no_overlap
from {{ cookiecutter.package_name }}.fused_add_rms_norm import fused_add_rms_norm_reference

OPS = torch.ops.{{ cookiecutter.package_name }}
F32, BF16 = torch.float32, torch.bfloat16
# (3, 16389): rows too wide to be held in registers.
SHAPES = [(1, 7), (3, 4096), (5, 8193), (3, 16389), (2, 3, 96), (65, 128)]
# Shapes the CUDA kernels launch differently: a few rows (decode sizes), many rows, a grid just
# over one wave of blocks (8192x1024), rows within a warp in one wave (4096x1024), rows read in
# 8-byte vectors (300x4100) and one element at a time (2000x127).
GPU_SHAPES = [(1, 4096), (256, 4096), (4096, 4096), (8192, 1024), (4096, 1024)]
GPU_SHAPES += [(300, 4100), (2000, 127)]
# (x dtype, residual dtype): the residual stream is often kept in float32. The first is the one
# the CUDA graph tests capture.
DTYPES = [(BF16, F32), (F32, F32), (torch.float16, torch.float16), (BF16, BF16)]
# Where fused_add_rms_norm_ writes: into contiguous tensors, and into rows a stride apart (slices
# of wider rows, base[..., :n], as after splitting a fused projection).
IN_PLACE_LAYOUTS = ["contiguous", "strided"]
# Row widths the kernels handle differently: a few elements, 16-byte vectors or not, wide rows.
IN_PLACE_WIDTHS = [8, 768, 769, 5120, 5125, 8192]


def inputs(shape, dtypes, device, weight=True, requires_grad=False):
    x = torch.randn(shape, dtype=dtypes[0], device=device, requires_grad=requires_grad)
    r = torch.randn(shape, dtype=dtypes[1], device=device, requires_grad=requires_grad)
    w = torch.randn(shape[-1], device=device, requires_grad=requires_grad) if weight else None
    return x, r, w


def in_place_inputs(n, dtypes, device, layout, weight=True):
    """x, residual and weight with rows n wide, x and residual of shape (2, 3, n) laid out as
    layout says. Strided: x is columns 3 to 3 + n of rows n + 7 wide (neither its start nor its
    rows 16-byte aligned), residual the first n columns of rows 2n wide."""
    w = torch.randn(n, device=device) if weight else None
    if layout == "contiguous":
        return *inputs((2, 3, n), dtypes, device, weight=False)[:2], w
    x_base = torch.randn(2, 3, n + 7, dtype=dtypes[0], device=device)
    r_base = torch.randn(2, 3, 2 * n, dtype=dtypes[1], device=device)
    return x_base[..., 3 : 3 + n], r_base[..., :n], w


class TestFusedAddRmsNorm(DifferentiableOpTests):
    function = staticmethod(fused_add_rms_norm)
    reference = staticmethod(fused_add_rms_norm_reference)
    namespace = OPS.name
    dtypes = DTYPES
    # Under forward-mode AD the function runs the reference, as rms_norm does.
    check_forward_ad = True

    def samples(self, device, dtypes):
        """Each shape with and without a weight; on a GPU, the shapes the CUDA kernels launch
        differently too."""
        for shape in SHAPES + (GPU_SHAPES if device == "cuda" else []):
            for weight in (True, False):
                yield Sample((*inputs(shape, dtypes, device, weight), 1e-6))

    def gradcheck_samples(self, device):
        """Ranks, eps, a float32 residual under bf16 x, transposed x and residual; small, as
        gradcheck takes them in float64 and perturbs each element."""
        yield Sample((*inputs((3, 17), (F32, F32), device), 1e-6))
        yield Sample((*inputs((2, 3, 10), (BF16, F32), device, weight=False), 1e-5))
        x, r, _ = inputs((12, 4), (F32, F32), device)
        yield Sample((x.t(), r.t(), torch.randn(12, device=device), 1e-6))

    def compile_samples(self, device):
        # Two shapes through one graph, as its shapes are dynamic: each other kind of sample
        # would compile another (seconds each on CPU).
        for shape in ((4, 64), (7, 96)):
            yield Sample((*inputs(shape, (F32, F32), device), 1e-6))

    def bad_calls(self):
        def call(shape=(4, 8), dtype=F32, x_dtype=F32):  # residual's shape and dtype
            def make(device):
                x = torch.randn(4, 8, device=device).to(x_dtype)
                return Sample((x, torch.ones(shape, device=device).to(dtype)))

            return make

        return [
            BadCall(
                call((4, 9)), ValueError, r"residual must have x's shape \(4, 8\), got \(4, 9\)"
            ),
            BadCall(call(dtype=torch.long), TypeError, "residual must be float32.*got torch.int64"),
            # The dtype pairs the kernels are built for: x's dtype, or float32 under a 16-bit x.
            BadCall(call(dtype=BF16), TypeError, r"residual must have x's dtype \(torch.float32\)"),
            BadCall(
                call(dtype=BF16, x_dtype=torch.float16),
                TypeError,
                r"residual must have x's dtype \(torch.float16\) or float32, got torch.bfloat16",
            ),
        ]


class TestFusedAddRmsNormInPlace(InferenceOpTests):
    """fused_add_rms_norm_ writes fused_add_rms_norm's (y, new_residual) into (x, residual)."""

    function = staticmethod(fused_add_rms_norm_)
    reference = staticmethod(fused_add_rms_norm_reference)
    namespace = OPS.name
    dtypes = [*DTYPES, (torch.float64, torch.float64)]
    mutates = (0, 1)
{%- if cookiecutter.variant == 'triton' %}

    def compile_backend(self, device):
        # On CPU the op runs the reference, which Inductor's C++ backend fails to compile when it
        # writes into inputs (pytorch/pytorch#196570): test the functionalization alone there.
        return "aot_eager" if device == "cpu" else "inductor"
{%- endif %}

    def samples(self, device, dtypes, widths=IN_PLACE_WIDTHS):
        for n in widths:
            for layout in IN_PLACE_LAYOUTS:
                yield Sample((*in_place_inputs(n, dtypes, device, layout), 1e-6))

    def gradcheck_samples(self, device):  # for opcheck: the op has no gradient
        for dtypes in DTYPES:
            for layout in IN_PLACE_LAYOUTS:
                for weight in (True, False):
                    yield Sample((*in_place_inputs(40, dtypes, device, layout, weight), 1e-5))

    def compile_samples(self, device):
        # Two widths through one graph, as its shapes are dynamic.
        for layout in IN_PLACE_LAYOUTS:
            for n in (64, 96):
                yield Sample((*in_place_inputs(n, (F32, F32), device, layout), 1e-6))

    def bad_calls(self):
        def call(**changes):
            """A call on x and residual of shape (3, 2, 8), with the arguments changes makes
            (each a function of the device) instead."""

            def make(device):
                made = {
                    "x": lambda d: torch.randn(3, 2, 8, device=d),
                    "residual": lambda d: torch.randn(3, 2, 8, device=d),
                    "weight": lambda d: torch.randn(8, device=d),
                    **changes,
                }
                return Sample(tuple(f(device) for f in made.values()))

            return make

        def transposed(d):  # the last dimension not contiguous
            return torch.randn(3, 8, 2, device=d).transpose(1, 2)

        def overlapping(d):  # rows with stride 0
            return torch.randn(1, 1, 8, device=d).expand(3, 2, 8)

        def uneven(d):  # rows 8, then 24 apart
            return torch.randn(3, 4, 8, device=d)[:, :2]

        rows = r"rows must be one stride apart and not overlap .* got shape \(3, 2, 8\)"
        return [
            BadCall(
                call(x=lambda d: torch.randn(3, 2, 8, device=d, requires_grad=True)),
                RuntimeError,
                "no backward, but x requires grad",
            ),
            BadCall(
                call(weight=lambda d: torch.nn.Parameter(torch.randn(8, device=d))),
                RuntimeError,
                "no backward, but weight requires grad",
            ),
            BadCall(call(x=transposed), ValueError, "x must be contiguous.*fused_add_rms_norm_ wr"),
            BadCall(call(residual=transposed), ValueError, "residual must be contiguous"),
            BadCall(
                call(residual=lambda d: torch.randn(3, 2, 9, device=d)),
                ValueError,
                r"residual must have x's shape \(3, 2, 8\), got \(3, 2, 9\)",
            ),
            BadCall(call(x=overlapping), ValueError, rf"x's {rows} and strides \(0, 0, 1\)"),
            BadCall(call(x=uneven), ValueError, rf"x's {rows} and strides \(32, 8, 1\)"),
            BadCall(call(residual=uneven), ValueError, f"residual's {rows}"),
        ]


def test_same_as_the_unfused_composition(device):
    # What fused_add_rms_norm replaces: rms_norm(x + residual, weight), in x's dtype.
    for dtypes in DTYPES:
        for sample in TestFusedAddRmsNorm().samples(device, dtypes):
            x, r, w, eps = sample.args
            y, _ = fused_add_rms_norm(x, r, w, eps)
            tol = max(TOL[x.dtype], TOL[r.dtype])
            torch.testing.assert_close(y, rms_norm(x + r, w, eps).to(x.dtype), atol=tol, rtol=tol)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("used", ["y", "new_residual"])
def test_backward_through_one_output(device, used, compiled):
    # The other output gets no gradient at all (not a zero tensor), as when a block's last
    # residual stream is dropped.
    x, r, w = inputs((6, 40), (F32, F32), device, requires_grad=True)
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    pick = 0 if used == "y" else 1
    fn = torch.compile(fused_add_rms_norm, fullgraph=True) if compiled else fused_add_rms_norm
    fn(x, r, w)[pick].square().sum().backward()
    fused_add_rms_norm_reference(x64, r64, w64)[pick].square().sum().backward()
    for got, want in ((x.grad, x64.grad), (r.grad, r64.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
    if used == "y":
        torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-4, rtol=1e-5)
    else:
        assert w.grad is None or not w.grad.any()


def test_x_and_residual_get_a_gradient_each(device):
    # The op returns one gradient for x and residual; autograd gives each leaf its own .grad.
    for dtypes in DTYPES:
        x, r, w = inputs((3, 17), dtypes, device, requires_grad=True)
        y, h = fused_add_rms_norm(x, r, w)
        torch.autograd.backward((y, h), (torch.randn_like(y), torch.randn_like(h)))
        assert x.grad.data_ptr() != r.grad.data_ptr()


def test_rstd_needs_no_gradient(device):
    # As in rms_norm: rstd is saved for the backward, not differentiated.
    x, r, w = inputs((3, 17), (F32, F32), device, requires_grad=True)
    y, h, rstd = OPS.fused_add_rms_norm_fwd(x, r, w, 1e-6)
    assert y.requires_grad and h.requires_grad and not rstd.requires_grad


def test_second_derivative_is_a_clear_error(device):
    x, r, w = inputs((3, 17), (torch.float64, torch.float64), device, requires_grad=True)
    y, h = fused_add_rms_norm(x, r, w)
    (dx,) = torch.autograd.grad(y.square().sum() + h.sum(), x, create_graph=True)
    match = f"{OPS.name}::fused_add_rms_norm_bwd has no derivative"
    with pytest.raises(RuntimeError, match=match):
        dx.square().sum().backward()


def fused_bwd_args(
    device,
    grad_y_dtype=BF16,
    grad_res_shape=(4, 8),
    grad_res_dtype=F32,
    **changes,
):
    args = dict(
        grad_y=torch.ones(4, 8, device=device, dtype=grad_y_dtype),
        grad_new_residual=torch.ones(grad_res_shape, device=device, dtype=grad_res_dtype),
        new_residual=torch.ones(4, 8, device=device),
        rstd=torch.ones(4, device=device),
        weight=None,
    )
    return {**args, **changes}


@pytest.mark.parametrize(
    "changes,error,match",
    [
        (dict(grad_res_shape=(4, 9)), ValueError, "grad_new_residual must have new_residual's sh"),
        (
            dict(grad_res_dtype=BF16),
            TypeError,
            r"grad_new_residual must have new_residual's dtype \(torch.float32\)",
        ),
        (dict(grad_y_dtype=torch.int64), TypeError, "grad_y must be float32.*got torch.int64"),
        (
            dict(grad_y_dtype=torch.float64),
            TypeError,
            r"new_residual must have grad_y's dtype \(torch.float64\), got torch.float32",
        ),
        (dict(rstd=torch.ones(())), ValueError, r"rstd must have shape \(4,\), got \(\)"),
    ],
)
def test_bad_backward_input_is_a_clear_error(checked_device, changes, error, match):
    # The backward op called directly, as autograd calls it: errors name its own arguments.
    with pytest.raises(ops_error(checked_device, error), match=match):
        OPS.fused_add_rms_norm_bwd(**fused_bwd_args(checked_device, **changes))


def test_in_place_writes_what_fused_add_rms_norm_returns(device):
    # The same kernel writes the same bits, into the inputs instead of new tensors.
    for dtypes in DTYPES:
        for sample in TestFusedAddRmsNorm().samples(device, dtypes):
            y, h = fused_add_rms_norm(*sample.args)
            fused_add_rms_norm_(*sample.args)
            x, r = sample.args[:2]
            assert torch.equal(x, y) and torch.equal(r, h), sample


def test_in_place_refuses_overlapping_arguments(checked_device):
    x, r, w = inputs((4, 8), (F32, F32), checked_device)
    with torch.no_grad():  # a model's parameters, under no_grad: fine
        fused_add_rms_norm_(x, r, torch.nn.Parameter(w))
    if checked_device == "meta":  # meta tensors have no memory to overlap
        return
    buffer = torch.randn(6, 8, device=checked_device)
    for a, b in ((x, x), (buffer[:4], buffer[2:])):
        with pytest.raises(ValueError, match="x and residual must not overlap in memory"):
            fused_add_rms_norm_(a, b, w)
    # A weight inside x or residual would change as rows are written.
    with pytest.raises(ValueError, match="x and weight must not overlap in memory"):
        fused_add_rms_norm_(x, r, x[1])
    with pytest.raises(ValueError, match="residual and weight must not overlap in memory"):
        fused_add_rms_norm_(x, r, r.flatten()[::4])


def test_overlap_check_passes_tensors_without_memory_of_their_own():
    # A tensor under vmap has no storage (test_distributed.py runs the op on DTensors, whose
    # data_ptr() is 0): there is no memory to compare, and no overlap to refuse.
    x, r, w = inputs((3, 4, 8), (F32, F32), "cpu")
    torch.vmap(lambda a, b: check_no_overlap(a, b, w) or a)(x, r)
{%- if cookiecutter.variant == 'triton' %}


# The Triton kernels called directly, as in test_rms_norm.py.
KERNEL_SHAPES = [(0, 64), (1, 7), (5, 1000), (3, 4097), (2, 20000)]


@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", [(F32, F32), (BF16, F32)], ids=str)
@pytest.mark.parametrize("grad_h", [True, False], ids=["grad_h", "no_grad_h"])
def test_kernels(kernel_device, shape, dtypes, grad_h):
    x, r, w = inputs(shape, dtypes, kernel_device)
    dy, dh = torch.randn_like(x), torch.randn_like(r) if grad_h else None
    x64, r64, w64 = (t.double().requires_grad_() for t in (x, r, w))
    want_y, want_h = fused_add_rms_norm_reference(x64, r64, w64)
    grads = [dy.double(), torch.zeros_like(want_h) if dh is None else dh.double()]
    torch.autograd.backward([want_y, want_h], grads)

    y, h, rstd = fused_add_rms_norm_kernels.fused_add_rms_norm_fwd(x, r, w, 1e-6, with_rstd=True)
    tol_h, tol = TOL[dtypes[1]], TOL[dtypes[0]]
    torch.testing.assert_close(h.double(), want_h, atol=tol_h, rtol=tol_h)
    torch.testing.assert_close(y.double(), want_y, atol=tol, rtol=tol)
    grad_h, dw = fused_add_rms_norm_kernels.fused_add_rms_norm_bwd(dy, dh, h, rstd, w)
    assert grad_h.dtype == r.dtype
    torch.testing.assert_close(grad_h.double(), r64.grad, atol=tol, rtol=tol)
    # x's gradient is the same tensor, as autograd rounds it to x's dtype.
    torch.testing.assert_close(grad_h.to(x.dtype).double(), x64.grad, atol=tol, rtol=tol)
    rows = max(shape[0], 1)
    torch.testing.assert_close(dw.double(), w64.grad, atol=tol * rows**0.5, rtol=tol)


@pytest.mark.parametrize("dtypes", TestFusedAddRmsNormInPlace.dtypes, ids=str)
def test_in_place_kernels(kernel_device, dtypes):
    # TestFusedAddRmsNormInPlace's values check on the kernel itself; 20000: wider than registers.
    test = TestFusedAddRmsNormInPlace()
    for sample in test.samples(kernel_device, dtypes, widths=[*IN_PLACE_WIDTHS, 20000]):
        test.check_values(sample, fused_add_rms_norm_kernels.fused_add_rms_norm_)
{%- endif %}
