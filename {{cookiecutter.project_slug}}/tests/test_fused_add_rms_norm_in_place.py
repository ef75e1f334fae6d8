"""fused_add_rms_norm_, the in-place form: fused_add_rms_norm's results written into x and
residual, opcheck of a mutating op, torch.compile's handling of the mutation, CUDA graphs, and the
calls it refuses."""

import pytest
import torch
from torch.library import opcheck

from {{ cookiecutter.package_name }} import fused_add_rms_norm, fused_add_rms_norm_

OPS = torch.ops.{{ cookiecutter.package_name }}
SHAPES = [(1, 7), (3, 4096), (5, 8193), (3, 16389), (2, 3, 96)]
# (x dtype, residual dtype), as for fused_add_rms_norm.
DTYPES = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
]


def inputs(shape, dtypes, device, weight=True):
    x = torch.randn(shape, dtype=dtypes[0], device=device)
    r = torch.randn(shape, dtype=dtypes[1], device=device)
    return x, r, torch.randn(shape[-1], device=device) if weight else None


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtypes", DTYPES, ids=str)
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_writes_what_fused_add_rms_norm_returns(device, shape, dtypes, weight):
    x, r, w = inputs(shape, dtypes, device, weight)
    y, h = fused_add_rms_norm(x, r, w)  # tested against float64 in test_fused_add_rms_norm.py
    fused_add_rms_norm_(x, r, w)
    # The same kernel writes the same bits, into the inputs instead of new tensors.
    assert torch.equal(x, y) and torch.equal(r, h)


@pytest.mark.parametrize("dtypes", DTYPES, ids=str)
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no_weight"])
def test_opcheck(device, dtypes, weight):
    # Among its checks: the op writes into no argument its schema does not mark as mutated.
    x, r, w = inputs((2, 3, 40), dtypes, device, weight)
    opcheck(OPS.fused_add_rms_norm_.default, (x, r, w, 1e-5))


def decode_step(x, residual, w):
    fused_add_rms_norm_(x, residual, w)
    return x * 2.0  # reads the x the op wrote


def test_compile_fullgraph_mutates_the_inputs_once(device):
{%- if cookiecutter.variant == 'triton' %}
    # On CPU the op runs the reference, which Inductor's C++ backend fails to compile when it
    # writes into inputs (pytorch/pytorch#196570): test the functionalization alone there.
    backend = "aot_eager" if device == "cpu" else "inductor"
{%- else %}
    backend = "inductor"
{%- endif %}
    compiled = torch.compile(decode_step, fullgraph=True, dynamic=True, backend=backend)
    for shape in [(4, 64), (7, 96)]:
        x, r, w = inputs(shape, (torch.float32, torch.float32), device)
        y, h = fused_add_rms_norm(x, r, w)
        out = compiled(x, r, w)
        # Twice would give residual = residual + 2 * x, and x normalized from that.
        torch.testing.assert_close(r, h, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, y * 2.0, atol=1e-5, rtol=1e-5)
    explanation = torch._dynamo.explain(decode_step)(x, r, w)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.cuda
def test_cuda_graph_replay_writes_the_captured_buffers():
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
    with pytest.raises(ValueError, match="x must be contiguous, as fused_add_rms_norm_ writes"):
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
