"""fused_add_rms_norm against the float64 reference and the unfused composition: values,
gradients (through both outputs), opcheck and torch.compile; and its in-place form
fused_add_rms_norm_: the same results written into its inputs, opcheck of a mutating op,
torch.compile's handling of the mutation, CUDA graphs, and the calls it refuses."""

import pytest
import torch
from conftest import ops_error
from torch.library import opcheck

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
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}
# (3, 16389): rows too wide to be held in registers.
SHAPES = [(1, 7), (3, 4096), (5, 8193), (3, 16389), (2, 3, 96), (65, 128)]
# Shapes the CUDA kernels launch differently (see test_few_and_many_rows).
GPU_SHAPES = [(1, 4096), (256, 4096), (4096, 4096), (8192, 1024), (4096, 1024)]
GPU_SHAPES += [(300, 4100), (2000, 127)]  # rows read in 8-byte vectors, and one element at a time
# (x dtype, residual dtype): the residual stream is often kept in float32.
DTYPES = [
    (torch.float32, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
]
# Where fused_add_rms_norm_ writes: into contiguous tensors, and into rows a stride apart (slices
# of wider rows, base[..., :n], as after splitting a fused projection).
IN_PLACE_LAYOUTS = ["contiguous", "strided"]
# Row widths the kernels handle differently: a few elements, 16-byte vectors or not, wide rows.
IN_PLACE_WIDTHS = [8, 768, 769, 5120, 5125, 8192]


def loose(*dtypes):
    return max(TOL[d] for d in dtypes)


def inputs(shape, dtypes, device, weight=True, requires_grad=False):
    x = torch.randn(shape, dtype=dtypes[0], device=device, requires_grad=requires_grad)
    r = torch.randn(shape, dtype=dtypes[1], device=device, requires_grad=requires_grad)
    w = torch.randn(shape[-1], device=device, requires_grad=requires_grad) if weight else None
    return x, r, w


def ref64(x, r, w):
    return fused_add_rms_norm_reference(x.double(), r.double(), None if w is None else w.double())


def in_place_views(n, dtypes, device, layout):
    """x and residual of shape (2, 3, n) laid out as layout says, and the parts of their buffers
    outside them, which fused_add_rms_norm_ must leave as they are. Strided: x is columns 3 to
    3 + n of rows n + 7 wide (neither its start nor its rows 16-byte aligned), residual the first
    n columns of rows 2n wide."""
    if layout == "contiguous":
        return *inputs((2, 3, n), dtypes, device, weight=False)[:2], []
    x_base = torch.randn(2, 3, n + 7, dtype=dtypes[0], device=device)
    r_base = torch.randn(2, 3, 2 * n, dtype=dtypes[1], device=device)
    outside = [x_base[..., :3], x_base[..., 3 + n :], r_base[..., n:]]
    return x_base[..., 3 : 3 + n], r_base[..., :n], outside


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", DTYPES, ids=str)
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_forward(device, shape, dtypes, weight):
    check_forward(device, shape, dtypes, weight)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", DTYPES, ids=str)
def test_backward_through_both_outputs(device, shape, dtypes):
    check_backward(device, shape, dtypes)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", DTYPES[2:], ids=str)
def test_few_and_many_rows(shape, dtypes):
    """A GPU kernel may launch a few rows (decode sizes), many rows, a grid just over one wave
    of blocks (8192x1024) and rows within a warp in one wave (4096x1024; 2000x127 with
    single-element loads) differently: all against float64."""
    check_forward("cuda", shape, dtypes, weight=True)
    check_backward("cuda", shape, dtypes)


def check_forward(device, shape, dtypes, weight):
    x, r, w = inputs(shape, dtypes, device, weight)
    y, h = fused_add_rms_norm(x, r, w)
    assert y.dtype == x.dtype and h.dtype == r.dtype and y.shape == h.shape == x.shape
    y64, h64 = ref64(x, r, w)
    tol = loose(*dtypes)
    torch.testing.assert_close(h.double(), h64, atol=tol, rtol=tol)
    torch.testing.assert_close(y.double(), y64, atol=tol, rtol=tol)
    # The same as the unfused composition it replaces.
    y_unfused = rms_norm(x + r, w).to(x.dtype)
    torch.testing.assert_close(y, y_unfused, atol=tol, rtol=tol)
    # The call above needed no gradient and ran the forward without rstd; the one with rstd
    # writes the same outputs.
    y_fwd, h_fwd, _ = OPS.fused_add_rms_norm_fwd(x, r, w, 1e-6)
    assert torch.equal(y, y_fwd) and torch.equal(h, h_fwd)


def check_backward(device, shape, dtypes):
    x, r, w = inputs(shape, dtypes, device, requires_grad=True)
    dy, dh = torch.randn_like(x), torch.randn_like(r)
    y, h = fused_add_rms_norm(x, r, w)
    torch.autograd.backward((y, h), (dy, dh))

    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    y64, h64 = fused_add_rms_norm_reference(x64, r64, w64)
    torch.autograd.backward((y64, h64), (dy.double(), dh.double()))
    tol = loose(*dtypes)
    assert x.grad.dtype == x.dtype and r.grad.dtype == r.dtype and w.grad.dtype == w.dtype
    # The op returns one gradient for x and residual; autograd gives each leaf its own .grad.
    assert x.grad.data_ptr() != r.grad.data_ptr()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=tol, rtol=tol)
    torch.testing.assert_close(r.grad.double(), r64.grad, atol=tol, rtol=tol)
    rows = x.numel() // shape[-1]
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=tol * rows**0.5, rtol=tol)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("used", ["y", "new_residual"])
def test_backward_through_one_output(device, used, compiled):
    # The other output gets no gradient at all (not a zero tensor), as when a block's last
    # residual stream is dropped.
    x, r, w = inputs((6, 40), (torch.float32, torch.float32), device, requires_grad=True)
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


def test_rstd_needs_no_gradient(device):
    # As in rms_norm: rstd is saved for the backward, not differentiated.
    x, r, w = inputs((3, 17), (torch.float32, torch.float32), device, requires_grad=True)
    y, h, rstd = OPS.fused_add_rms_norm_fwd(x, r, w, 1e-6)
    assert y.requires_grad and h.requires_grad and not rstd.requires_grad


def test_gradcheck(device):
    x, r, w = (
        torch.randn(shape, dtype=torch.float64, device=device, requires_grad=True)
        for shape in ((3, 17), (3, 17), (17,))
    )
    assert torch.autograd.gradcheck(fused_add_rms_norm, (x, r, w, 1e-6), check_forward_ad=True)


def test_second_derivative_is_a_clear_error(device):
    x, r, w = inputs((3, 17), (torch.float64, torch.float64), device, requires_grad=True)
    y, h = fused_add_rms_norm(x, r, w)
    (dx,) = torch.autograd.grad(y.square().sum() + h.sum(), x, create_graph=True)
    match = f"{OPS.name}::fused_add_rms_norm_bwd has no derivative"
    with pytest.raises(RuntimeError, match=match):
        dx.square().sum().backward()


def sample_inputs(device):
    bf16, f32 = torch.bfloat16, torch.float32
    for requires_grad in (False, True):
        yield *inputs((8, 64), (f32, f32), device, True, requires_grad), 1e-6
        yield *inputs((2, 3, 40), (bf16, f32), device, False, requires_grad), 1e-5
        x, r, w = inputs((48, 16), (f32, f32), device, True)
        x, r = x.t().requires_grad_(requires_grad), r.t().requires_grad_(requires_grad)
        yield x, r, torch.randn(48, device=device).requires_grad_(requires_grad), 1e-6


CASES = range(len(list(sample_inputs("cpu"))))


@pytest.mark.parametrize("case", CASES)
def test_opcheck_fwd(device, case):
    opcheck(OPS.fused_add_rms_norm_fwd.default, list(sample_inputs(device))[case])


@pytest.mark.parametrize("case", CASES)
def test_opcheck_fwd_without_rstd(device, case):
    # The forward for calls that need no gradient: its inputs do not require grad.
    args = list(sample_inputs(device))[case]
    args = [t.detach() if isinstance(t, torch.Tensor) else t for t in args]
    opcheck(OPS.fused_add_rms_norm.default, args)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("grad_residual", [True, False], ids=["grad_h", "no_grad_h"])
def test_opcheck_bwd(device, case, grad_residual):
    x, r, w, eps = (
        t.detach() if isinstance(t, torch.Tensor) else t for t in list(sample_inputs(device))[case]
    )
    y, h, rstd = OPS.fused_add_rms_norm_fwd(x, r, w, eps)
    dh = torch.randn_like(h) if grad_residual else None
    opcheck(OPS.fused_add_rms_norm_bwd.default, (torch.randn_like(y), dh, h, rstd, w))


def block(x, residual, w):
    y, h = fused_add_rms_norm(x, residual, w)
    return (y * 2.0).sum() + h.square().sum()


def test_compile_fullgraph_dynamic_no_graph_breaks(device):
    torch.compiler.reset()  # as in test_rms_norm.py: no graphs of block from other tests
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for shape in [(4, 64), (7, 96)]:
        x, r, w = inputs(shape, (torch.float32, torch.float32), device, requires_grad=True)
        compiled(x, r, w).backward()
        x2, r2, w2 = (t.detach().requires_grad_() for t in (x, r, w))
        block(x2, r2, w2).backward()
        for got, want in ((x.grad, x2.grad), (r.grad, r2.grad), (w.grad, w2.grad)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    explanation = torch._dynamo.explain(block)(x, r, w)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_bad_residual_is_a_clear_error(checked_device):
    x = torch.randn(4, 8, device=checked_device)
    with pytest.raises(ValueError, match=r"residual must have x's shape \(4, 8\), got \(4, 9\)"):
        fused_add_rms_norm(x, torch.randn(4, 9, device=checked_device))
    with pytest.raises(TypeError, match="residual must be float32.*got torch.int64"):
        fused_add_rms_norm(x, torch.ones(4, 8, dtype=torch.long, device=checked_device))
    # The dtype pairs the kernels are built for: x's dtype, or float32 under a 16-bit x.
    with pytest.raises(TypeError, match=r"residual must have x's dtype \(torch.float32\), got"):
        fused_add_rms_norm(x, torch.ones(4, 8, dtype=torch.bfloat16, device=checked_device))
    with pytest.raises(
        TypeError,
        match=r"residual must have x's dtype \(torch.float16\) or float32, got torch.bfloat16",
    ):
        fused_add_rms_norm(x.half(), torch.ones(4, 8, dtype=torch.bfloat16, device=checked_device))


def fused_bwd_args(
    device,
    grad_y_dtype=torch.bfloat16,
    grad_res_shape=(4, 8),
    grad_res_dtype=torch.float32,
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
            dict(grad_res_dtype=torch.bfloat16),
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
    # As in test_edge_cases: errors name the fused op's own arguments.
    with pytest.raises(ops_error(checked_device, error), match=match):
        OPS.fused_add_rms_norm_bwd(**fused_bwd_args(checked_device, **changes))


# fused_add_rms_norm_, the in-place form: fused_add_rms_norm's results written into x and residual.
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", DTYPES, ids=str)
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_in_place_writes_what_fused_add_rms_norm_returns(device, shape, dtypes, weight):
    x, r, w = inputs(shape, dtypes, device, weight)
    y, h = fused_add_rms_norm(x, r, w)  # tested against float64 above
    fused_add_rms_norm_(x, r, w)
    # The same kernel writes the same bits, into the inputs instead of new tensors.
    assert torch.equal(x, y) and torch.equal(r, h)


@pytest.mark.parametrize("n", IN_PLACE_WIDTHS)
@pytest.mark.parametrize("layout", IN_PLACE_LAYOUTS)
@pytest.mark.parametrize("dtypes", [*DTYPES, (torch.float64, torch.float64)], ids=str)
def test_in_place_against_float64(device, n, layout, dtypes):
    check_in_place(fused_add_rms_norm_, device, n, layout, dtypes)


def check_in_place(write, device, n, layout, dtypes):
    """write(x, residual, weight) writes fused_add_rms_norm's results into x and residual, laid
    out as layout says, and nothing else."""
    x, r, outside = in_place_views(n, dtypes, device, layout)
    w = torch.randn(n, device=device)
    y64, h64 = ref64(x, r, w)
    outside_before = [t.clone() for t in outside]
    write(x, r, w)
    tol = loose(*dtypes)
    torch.testing.assert_close(r.double(), h64, atol=tol, rtol=tol)
    torch.testing.assert_close(x.double(), y64, atol=tol, rtol=tol)
    assert all(map(torch.equal, outside, outside_before)), "wrote outside x or residual"


@pytest.mark.parametrize("layout", IN_PLACE_LAYOUTS)
@pytest.mark.parametrize("dtypes", DTYPES, ids=str)
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_opcheck_in_place(device, layout, dtypes, weight):
    # Among its checks: the op writes into no argument its schema does not mark as mutated.
    x, r, _ = in_place_views(40, dtypes, device, layout)
    w = torch.randn(40, device=device) if weight else None
    opcheck(OPS.fused_add_rms_norm_.default, (x, r, w, 1e-5))


def decode_step(x, residual, w):
    fused_add_rms_norm_(x, residual, w)
    return x * 2.0  # reads the x the op wrote


@pytest.mark.parametrize("layout", IN_PLACE_LAYOUTS)
def test_in_place_compile_fullgraph_mutates_the_inputs_once(device, layout):
{%- if cookiecutter.variant == 'triton' %}
    # On CPU the op runs the reference, which Inductor's C++ backend fails to compile when it
    # writes into inputs (pytorch/pytorch#196570): test the functionalization alone there.
    backend = "aot_eager" if device == "cpu" else "inductor"
{%- else %}
    backend = "inductor"
{%- endif %}
    compiled = torch.compile(decode_step, fullgraph=True, dynamic=True, backend=backend)
    for n in [64, 96]:
        x, r, _ = in_place_views(n, (torch.float32, torch.float32), device, layout)
        w = torch.randn(n, device=device)
        y, h = fused_add_rms_norm(x, r, w)
        out = compiled(x, r, w)
        # Twice would give residual = residual + 2 * x, and x normalized from that.
        torch.testing.assert_close(r, h, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, y * 2.0, atol=1e-5, rtol=1e-5)
    explanation = torch._dynamo.explain(decode_step)(x, r, w)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.cuda
def test_in_place_cuda_graph_replay_writes_the_captured_buffers():
    x, r, w = inputs((8, 4096), (torch.bfloat16, torch.float32), "cuda")
    x0, r0 = x.clone(), r.clone()
    fused_add_rms_norm_(x, r, w)  # first call outside the capture: kernels compile, caches fill
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_add_rms_norm_(x, r, w)
    x.copy_(x0)
    r.copy_(r0)
    graph.replay()
    y, h = fused_add_rms_norm(x0, r0, w)
    assert torch.equal(x, y) and torch.equal(r, h)


def test_calls_it_cannot_do_in_place_are_clear_errors(checked_device):
    x, r, w = inputs((4, 8), (torch.float32, torch.float32), checked_device)
    with pytest.raises(RuntimeError, match="no backward, but x requires grad"):
        fused_add_rms_norm_(x.clone().requires_grad_(), r, w)
    with pytest.raises(RuntimeError, match="no backward, but weight requires grad"):
        fused_add_rms_norm_(x, r, torch.nn.Parameter(w))
    with torch.no_grad():  # a model's parameters, under no_grad: fine
        fused_add_rms_norm_(x, r, torch.nn.Parameter(w))
    not_contiguous = torch.randn(8, 4, device=checked_device).t()
    with pytest.raises(ValueError, match="x must be contiguous.*, as fused_add_rms_norm_ writes"):
        fused_add_rms_norm_(not_contiguous, r, w)
    with pytest.raises(ValueError, match="residual must be contiguous"):
        fused_add_rms_norm_(x, not_contiguous, w)
    with pytest.raises(ValueError, match=r"residual must have x's shape \(4, 8\), got \(4, 9\)"):
        fused_add_rms_norm_(x, torch.randn(4, 9, device=checked_device), w)
    if checked_device != "meta":  # meta tensors have no memory to overlap
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
    x, r, w = inputs((3, 4, 8), (torch.float32, torch.float32), "cpu")
    torch.vmap(lambda a, b: check_no_overlap(a, b, w) or a)(x, r)


def test_in_place_rows_it_cannot_write_are_clear_errors(checked_device):
    x, r, w = inputs((3, 2, 8), (torch.float32, torch.float32), checked_device)
    overlapping = torch.randn(1, 1, 8, device=checked_device).expand(3, 2, 8)  # strides 0
    uneven = torch.randn(3, 4, 8, device=checked_device)[:, :2]  # rows 8, then 24 apart
    match = r"x's rows must be one stride apart and not overlap .* got shape \(3, 2, 8\)"
    for rows, strides in ((overlapping, r"\(0, 0, 1\)"), (uneven, r"\(32, 8, 1\)")):
        with pytest.raises(ValueError, match=f"{match} and strides {strides}"):
            fused_add_rms_norm_(rows, r, w)
    with pytest.raises(ValueError, match="residual's rows must be one stride apart"):
        fused_add_rms_norm_(x, uneven, w)
{%- if cookiecutter.variant == 'triton' %}


# The Triton kernels called directly, as in test_rms_norm.py.
KERNEL_SHAPES = [(0, 64), (1, 7), (5, 1000), (3, 4097), (2, 20000)]


@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", [(torch.float32,) * 2, (torch.bfloat16, torch.float32)], ids=str)
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


@pytest.mark.parametrize("n", [*IN_PLACE_WIDTHS, 20000])  # 20000: wider than registers hold
@pytest.mark.parametrize("layout", IN_PLACE_LAYOUTS)
@pytest.mark.parametrize("dtypes", [*DTYPES, (torch.float64, torch.float64)], ids=str)
def test_in_place_kernels(kernel_device, n, layout, dtypes):
    def write(x, r, w):
        fused_add_rms_norm_kernels.fused_add_rms_norm_(x, r, w, 1e-6)

    check_in_place(write, kernel_device, n, layout, dtypes)
{%- endif %}
