"""Bad input gets a clear Python exception (the public function's bad calls are in
test_rms_norm.py); edge cases behave; CUDA graphs and determinism."""

import pytest
import torch
from conftest import ops_error
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from {{ cookiecutter.package_name }} import RMSNorm, rms_norm
from {{ cookiecutter.package_name }}.rms_norm import rms_norm_reference

F32 = torch.float32


def bwd_args(device, dtype=F32, grad_dtype=None, grad_shape=(4, 8), rstd_dtype=F32, rows=4):
    x = torch.ones(4, 8, device=device, dtype=dtype)
    grad_y = torch.ones(grad_shape, device=device, dtype=grad_dtype or dtype)
    return grad_y, x, torch.ones(rows, device=device, dtype=rstd_dtype), None


BF16 = torch.bfloat16


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(grad_dtype=torch.float64), TypeError, r"grad_y must have x's dtype \(torch.float32"),
        (dict(grad_shape=(4, 9)), ValueError, r"grad_y must have x's shape \(4, 8\), got \(4, 9"),
        (dict(rows=5), ValueError, r"rstd must have shape \(4,\), got \(5,\)"),
        (
            dict(dtype=BF16, rstd_dtype=BF16),
            TypeError,
            "rstd must be torch.float32 for x of dtype torch.bfloat16, got torch.bfloat16",
        ),
    ],
)
def test_bad_backward_input_is_a_clear_error(checked_device, kwargs, error, match):
    # The backward op is called by autograd, but also by hand through torch.ops and under
    # torch.compile (checked by the fake impl on meta tensors): the same checks everywhere.
    args = bwd_args(checked_device, **kwargs)
    with pytest.raises(ops_error(checked_device, error), match=match):
        torch.ops.{{ cookiecutter.package_name }}.rms_norm_bwd(*args)


@pytest.mark.parametrize("w_device", ["meta", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_weight_on_another_device(w_device):
    x, w = torch.ones(4, 8), torch.ones(8, device=w_device)
    with pytest.raises(ValueError, match=r"weight must be on x's device \(cpu\), got"):
        rms_norm(x, w)


def test_meta_tensors_give_shapes():
    y = rms_norm(torch.ones(3, 5, 8, device="meta"), torch.ones(8, device="meta"))
    assert y.shape == (3, 5, 8) and y.device.type == "meta"


def test_zero_rows(device):
    x = torch.randn(0, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    y = rms_norm(x, w)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad.shape == (0, 64)
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_zero_row_gives_zeros(device):
    x = torch.randn(3, 100, device=device)
    x[1] = 0
    y = rms_norm(x, torch.randn(100, device=device))
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    assert torch.isfinite(y).all()


def test_nan_stays_in_its_row(device):
    x = torch.randn(4, 300, device=device, requires_grad=True)
    with torch.no_grad():
        x[2, 17] = float("nan")
    w = torch.randn(300, device=device)
    y = rms_norm(x, w)
    assert torch.isnan(y[2]).all()
    assert torch.isfinite(y[[0, 1, 3]]).all()
    y.backward(torch.randn_like(y))
    assert torch.isfinite(x.grad[[0, 1, 3]]).all()


def test_very_wide_rows(device):
    n = 65536 + 3
    x = torch.randn(2, n, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device=device, requires_grad=True)
    y = rms_norm(x, w)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    rms_norm_reference(x64, w64).backward(dy.double())
    torch.testing.assert_close(y.double(), rms_norm_reference(x64, w64), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-3, rtol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "dtype,n",
    [
        (torch.bfloat16, 16384),
        (torch.bfloat16, 8192),
        (torch.bfloat16, 8200),
        (torch.float32, 8192),
        (torch.bfloat16, 4096),
        (torch.float16, 4088),
    ],
)
def test_large_input(dtype, n):
    # 512 MiB of x, in rows of widths that take different launches.
    m = (512 << 20) // (n * dtype.itemsize) + 3
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = 1 + 0.1 * torch.randn(n, device="cuda", dtype=dtype)
    y = rms_norm(x, w)
    tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
    for i in range(0, m, 2048):  # in float64 a slice at a time, <= 256 MiB each
        want = rms_norm_reference(x[i : i + 2048].double(), w.double())
        torch.testing.assert_close(y[i : i + 2048].double(), want, atol=tol, rtol=tol)


@pytest.mark.cuda
def test_more_rows_than_int32_can_index():
    # Row indices past 2**31, forward and backward: rows of one element (an eps that large
    # keeps dx away from zero there).
    m, eps = (1 << 31) + 5, 0.5
    # x, y, dy and dx in bfloat16, rstd in float32, and float64 slices for the reference.
    need = m * (4 * 2 + 4) + (8 << 30)
    if need > 0.8 * torch.cuda.mem_get_info()[0]:
        pytest.skip(f"needs {need >> 30} GiB of free GPU memory")
    x = torch.randn(m, 1, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.full((1,), 1.5, device="cuda", requires_grad=True)
    dy = torch.randn(m, 1, device="cuda", dtype=torch.bfloat16)
    y = rms_norm(x, w, eps)
    y.backward(dy)
    w64 = w.detach().double().requires_grad_()
    want_dw = torch.zeros(1, dtype=torch.float64, device="cuda")
    for start in range(0, m, 1 << 27):
        rows = slice(start, start + (1 << 27))
        x64 = x[rows].detach().double().requires_grad_()
        want = rms_norm_reference(x64, w64, eps)
        dx64, dw64 = torch.autograd.grad(want, (x64, w64), dy[rows].double())
        want_dw += dw64
        if start == 0 or start + (1 << 27) >= (1 << 31):  # the first rows and those past 2**31
            torch.testing.assert_close(y[rows].double(), want, atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(x.grad[rows].double(), dx64, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(w.grad.double(), want_dw, atol=1e-3, rtol=1e-4)


def fwd_bwd(x, w, dy):
    x.grad = w.grad = None
    y = rms_norm(x, w)
    y.backward(dy)
    return y, x.grad, w.grad


def test_ops_stay_visible_to_what_watches_dispatched_ops(device):
    # Modes, a __torch_function__ subclass, vmap and the profiler see the ops as ops.
    x = torch.randn(3, 4, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    fwd, bwd = (f"{{ cookiecutter.package_name }}.rms_norm_{p}" for p in ("fwd", "bwd"))
    seen = []

    class RecordOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class RecordFunctions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with RecordOps():
        rms_norm(x, w).sum().backward()
    assert {f"{fwd}.default", f"{bwd}.default"} <= set(seen)
    seen.clear()
    with RecordFunctions():
        rms_norm(x, w)
    assert fwd in seen

    with torch.profiler.profile() as prof:
        rms_norm(x, w).sum().backward()
    names = {e.key.replace("::", ".") for e in prof.key_averages()}
    assert {fwd, bwd} <= names
    # Without grad the forward that returns no rstd runs.
    no_rstd = fwd.removesuffix("_fwd")
    with torch.profiler.profile() as prof, torch.no_grad():
        rms_norm(x, w)
    assert no_rstd in {e.key.replace("::", ".") for e in prof.key_averages()}

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return super().__torch_function__(func, types, args, kwargs or {})

    seen.clear()
    with torch.no_grad():
        rms_norm(x.as_subclass(Logged), w)
    assert no_rstd in seen

    with torch.no_grad():
        batched = torch.vmap(rms_norm, in_dims=(0, None))(x, w)
        assert torch.equal(batched, torch.stack([rms_norm(row, w) for row in x]))


@pytest.mark.cuda
def test_weight_grad_is_deterministic():
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)
    first = fwd_bwd(x, w, dy)[2].clone()
    for _ in range(5):
        assert torch.equal(fwd_bwd(x, w, dy)[2], first)


@pytest.mark.cuda
def test_no_host_synchronization():
    x = torch.randn(512, 1000, device="cuda", requires_grad=True)
    w = torch.randn(1000, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)
    fwd_bwd(x, w, dy)  # warm up: first calls may compile or query the device
    torch.cuda.set_sync_debug_mode("error")
    try:
        fwd_bwd(x, w, dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.cuda
def test_cuda_graph_replay_matches_eager():
    """The ops launch on the current stream, never synchronize and allocate only through the
    caching allocator, so forward and backward can be captured in a CUDA graph."""
    ops = torch.ops.{{ cookiecutter.package_name }}
    x = torch.randn(333, 2050, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2050, device="cuda")
    dy = torch.randn_like(x)

    def step():
        y, rstd = ops.rms_norm_fwd(x, w, 1e-6)
        dx, dw = ops.rms_norm_bwd(dy, x, rstd, w)
        return y, dx, dw

    expected = [t.clone() for t in step()]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm up off the default stream, as CUDA graph capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, expected, strict=True):
        assert torch.equal(got, want)


@pytest.mark.cuda
def test_compile_reduce_overhead():
    model = RMSNorm(1024, device="cuda")
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        x = torch.randn(64, 1024, device="cuda", requires_grad=True)
        x_ref = x.detach().requires_grad_()
        expected = model(x_ref)
        expected.sum().backward()
        # Each step's forward and backward replay CUDA graphs whose outputs the next step reuses.
        torch.compiler.cudagraph_mark_step_begin()
        y = compiled(x)
        y.sum().backward()
        torch.testing.assert_close(y, expected)
        torch.testing.assert_close(x.grad, x_ref.grad)
