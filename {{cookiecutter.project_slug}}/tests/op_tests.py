"""The checks every op gets, written once. An op's test file subclasses ``OpTests`` and declares
what is particular to the op: its public function, its float64 reference, its sample inputs, its
tolerances and the bad calls it must refuse. pytest then runs each check below on it:

- values against the reference run in float64, with the dtypes and shapes it gives, and nothing
  written outside the arguments the op mutates (an in-place op's values are those arguments);
- calls without gradient (the op without autograd's extras) give what calls with gradient give;
- gradients through every output against the reference's, and ``gradcheck`` in float64;
- ``torch.library.opcheck`` on every operator overload the function calls, forward and backward
  (the backward also with gradient reaching one output alone);
- ``torch.compile(fullgraph=True, dynamic=True)``: no graph break, the same values and gradients
  (an in-place op: its arguments written once);
- a CUDA graph capture and replay (on a GPU);
- each declared bad call raises the declared exception, on CPU, CUDA and meta tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import pytest
import torch
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

# Outputs are rounded once from float32 math: about two units in the last place.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


@dataclasses.dataclass
class Sample:
    """One call of the op's public function: ``function(*args, **kwargs)``."""

    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        def show(a):
            if isinstance(a, torch.Tensor):
                strided = "" if a.is_contiguous() else f" strides {a.stride()}"
                return f"{str(a.dtype)[6:]}{tuple(a.shape)}{strided}"
            return repr(a)

        return f"({', '.join(show(a) for a in (*self.args, *self.kwargs.values()))})"

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Sample:
        """The sample with fn applied to each tensor."""
        return Sample(
            *tree_map(
                lambda a: fn(a) if isinstance(a, torch.Tensor) else a, (self.args, self.kwargs)
            )
        )

    def tensors(self) -> list[torch.Tensor]:
        return [a for a in tree_flatten((self.args, self.kwargs))[0] if isinstance(a, torch.Tensor)]


@dataclasses.dataclass
class BadCall:
    """A call the op must refuse: ``make(device)`` gives its sample, which must raise
    ``error`` with a message matching ``match``."""

    make: Callable[[str], Sample]
    error: type[Exception]
    match: str


def poison_cache(device: str, numel: int) -> None:
    """Leaves NaN-filled blocks in the CUDA caching allocator, so an output element that a kernel
    forgets to write shows up as NaN instead of as a stale correct value."""
    if device == "cuda":
        for _ in range(4):
            torch.full((numel,), float("nan"), device=device)


def detach(a):
    return a.detach() if isinstance(a, torch.Tensor) else a


def outputs_of(result) -> list[torch.Tensor]:
    return [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]


def differentiable(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point


def copy_laid_out(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A copy of t (in dtype) with its strides and offset, in a copy of its whole buffer:
    ``clone()`` makes a slice of wider rows contiguous, and an op must see the layout given."""
    buffer = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    copy = buffer.to(dtype or t.dtype, copy=True)
    return copy.as_strided(t.shape, t.stride(), t.storage_offset())


def outside(tensors: list[torch.Tensor], written: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each tensor's buffer but the elements of the tensors in written: what an op that
    writes only into those must leave as it found."""
    kept = []
    for t in tensors:
        buffer = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
        keep = torch.ones_like(buffer, dtype=torch.bool)
        for w in written:
            if w.dtype == t.dtype and w.untyped_storage().data_ptr() == buffer.data_ptr():
                keep.as_strided(w.shape, w.stride(), w.storage_offset()).fill_(False)
        kept.append(buffer[keep])
    return kept


def assert_close(actual, expected, tol, what=""):
    torch.testing.assert_close(
        actual.double(), expected.double(), atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}"
    )


class RecordOps(TorchDispatchMode):
    """Records each call of an operator of ``namespace`` with its arguments, also those that
    autograd makes in the backward."""

    def __init__(self, namespace: str):
        super().__init__()
        self.namespace, self.calls = namespace, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == self.namespace:
            if not torch.is_grad_enabled():  # e.g. in the backward: called as if detached
                args, kwargs = tree_map(detach, (args, kwargs))
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


class OpTests:
    """The checks of every op. An op's test file subclasses one of the two kinds below, as
    ``class TestMyOp(DifferentiableOpTests)``, and sets the attributes."""

    function: Callable  # the public function, e.g. rms_norm
    reference: Callable  # the pure-PyTorch reference, same arguments
    namespace: str  # the torch.library namespace, whose operators opcheck checks
    dtypes: list  # what samples() takes as its dtype argument, one test each
    backward: bool  # set by the two kinds below
    check_forward_ad: bool = False  # gradcheck forward-mode AD too (the op must support it)
    mutates: tuple[int, ...] = ()  # an in-place op: the positions of the arguments it writes

    def samples(self, device: str, dtype) -> Iterable[Sample]:
        """Inputs to check the values and gradients with: shapes, strides and edge cases."""
        raise NotImplementedError

    def gradcheck_samples(self, device: str) -> Iterable[Sample]:
        """Small float64 inputs for gradcheck and opcheck."""
        raise NotImplementedError

    def compile_samples(self, device: str) -> Iterable[Sample]:
        """Inputs for the compile test, which runs them in float32: by default gradcheck's."""
        return self.gradcheck_samples(device)

    def bad_calls(self) -> Iterable[BadCall]:
        return []

    def compile_backend(self, device: str) -> str:
        """torch.compile's backend in the compile test."""
        return "inductor"

    def tolerance(self, dtype: torch.dtype) -> float:
        return TOL[dtype]

    def output_tolerance(self, sample: Sample, out: torch.Tensor) -> float:
        """The tolerance of one output: that of the least precise of it and the inputs."""
        dtypes = [out.dtype, *(t.dtype for t in sample.tensors() if differentiable(t))]
        return max(self.tolerance(d) for d in dtypes)

    def grad_tolerance(self, sample: Sample, grad: torch.Tensor) -> float:
        """A gradient smaller than the outputs sums over many of them (a weight's over the
        rows): its error grows with the square root of their number."""
        out_numel = max(t.numel() for t in sample.tensors())
        terms = max(out_numel // max(grad.numel(), 1), 1)
        return self.output_tolerance(sample, grad) * terms**0.5

    # The checks.

    def call(self, sample: Sample, function: Callable | None = None):
        result = (function or type(self).function)(*sample.args, **sample.kwargs)
        if self.mutates:  # an in-place op: its results are the arguments it wrote
            return [sample.args[i] for i in self.mutates]
        return result

    def call_reference(self, sample: Sample):
        return type(self).reference(*sample.args, **sample.kwargs)

    def test_values(self, device, dtype):
        for sample in self.samples(device, dtype):
            self.check_values(sample)

    def check_values(self, sample: Sample, function: Callable | None = None):
        """function (by default the op's) on sample against the reference in float64."""
        want = outputs_of(self.call_reference(sample.map(lambda t: t.double())))
        like = outputs_of(self.call_reference(sample.map(lambda t: t.to("meta"))))
        written = [sample.args[i] for i in self.mutates]
        before = outside(sample.tensors(), written)
        poison_cache(sample.tensors()[0].device.type, sum(t.numel() for t in like))
        got = outputs_of(self.call(sample, function))
        assert len(got) == len(want), sample
        for i, (g, w, m) in enumerate(zip(got, want, like, strict=True)):
            assert (g.shape, g.dtype) == (m.shape, m.dtype), f"{sample}: output {i}"
            assert_close(g, w, self.output_tolerance(sample, g), f"{sample}: output {i}")
        after = outside(sample.tensors(), written)
        assert all(map(torch.equal, before, after)), f"{sample}: wrote outside its outputs"

    def recorded_calls(self, sample: Sample):
        """The operator calls that the function makes on sample, with and without gradient,
        forward and backward."""
        recorder = RecordOps(self.namespace)
        with recorder:
            with torch.no_grad():
                self.call(sample.map(lambda t: copy_laid_out(t.detach())))
            if self.backward:
                grad_sample = sample.map(lambda t: t.detach().requires_grad_(differentiable(t)))
                outs = [o for o in outputs_of(self.call(grad_sample)) if o.requires_grad]
                # Every output's gradient, then each output's alone (the others' are None).
                chosen = [outs, *([o] for o in outs)] if len(outs) > 1 else [outs]
                for i, some in enumerate(chosen):
                    grads = [torch.randn_like(o) for o in some]
                    torch.autograd.backward(some, grads, retain_graph=i < len(chosen) - 1)
        assert recorder.calls, f"no operator of {self.namespace} ran on {sample}"
        return recorder.calls

    def test_opcheck(self, device):
        """opcheck on each overload called: schema, fake impl, autograd registration, and
        torch.compile's view of it (every argument as the function passed it)."""
        checked = set()
        for sample in self.gradcheck_samples(device):
            for overload, args, kwargs in self.recorded_calls(sample):
                opcheck(overload, args, kwargs)
                if any(isinstance(t, torch.Tensor) and t.requires_grad for t in args):
                    # The operator as a call that needs no gradient would make it.
                    opcheck(overload, *tree_map(detach, (args, kwargs)))
                checked.add(str(overload))
        assert checked

    def test_compile_fullgraph_dynamic(self, device):
        """torch.compile over the op and a few ops around it, with dynamic shapes: one graph,
        no break, the same values and gradients as eager (an in-place op: the arguments it
        wrote, read after it, written once)."""
        torch.compiler.reset()  # other tests' graphs count toward the recompile limit
        function, mutates = type(self).function, self.mutates

        def fn(*args, **kwargs):
            result = function(*args, **kwargs)
            return [o * 2.0 for o in ([args[i] for i in mutates] or outputs_of(result))]

        backend = self.compile_backend(device)
        compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=backend)
        for sample in self.compile_samples(device):
            sample = sample.map(lambda t: copy_laid_out(t.detach(), torch.float32))
            if self.backward:
                sample = sample.map(lambda t: t.requires_grad_(differentiable(t)))
            eager_sample = sample.map(
                lambda t: copy_laid_out(t.detach()).requires_grad_(t.requires_grad)
            )
            got, want = (
                compiled(*sample.args, **sample.kwargs),
                fn(*eager_sample.args, **eager_sample.kwargs),
            )
            for g, w in zip(got, want, strict=True):
                assert_close(g, w, 1e-5, f"{sample}: compiled output")
            if self.backward:
                leaves = [t for t in sample.tensors() if t.requires_grad]
                eager_leaves = [t for t in eager_sample.tensors() if t.requires_grad]
                grads = [torch.randn_like(w) for w in want]
                for g, w in zip(
                    torch.autograd.grad(got, leaves, grads, allow_unused=True),
                    torch.autograd.grad(want, eager_leaves, grads, allow_unused=True),
                    strict=True,
                ):
                    if w is not None:
                        assert_close(g, w, 1e-4, f"{sample}: compiled gradient")

    @pytest.mark.cuda
    def test_cuda_graph_replay(self):
        """The op launches on the current stream and allocates through the caching allocator:
        forward (and backward) captured in a CUDA graph replay what eager gives."""
        sample = next(iter(self.samples("cuda", self.dtypes[0])))
        leaves = [t for t in sample.tensors() if differentiable(t)] if self.backward else []

        def step():
            outs = outputs_of(self.call(sample))
            if not leaves:
                return outs
            return outs + list(torch.autograd.grad(outs, leaves, [o.detach() for o in outs]))

        if self.backward:
            sample = sample.map(lambda t: t.detach().requires_grad_(differentiable(t)))
            leaves = [t for t in sample.tensors() if t.requires_grad]
        inputs = [t.detach().clone() for t in sample.tensors()]
        expected = [t.detach().clone() for t in step()]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # warm up off the default stream, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        with torch.no_grad():  # an in-place op changed its inputs: start from the same ones
            for t, t0 in zip(sample.tensors(), inputs, strict=True):
                t.copy_(t0)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(captured, expected, strict=True):
            assert torch.equal(got, want)

    def test_bad_calls(self, checked_device):
        for bad in self.bad_calls():
            sample = bad.make(checked_device)
            with pytest.raises(bad.error, match=bad.match):
                self.call(sample)


class DifferentiableOpTests(OpTests):
    """An op with a backward: also its gradients, and the call without gradient."""

    backward = True

    def test_without_grad_same_values(self, device, dtype):
        """The call that needs no gradient takes another operator (no extras for the
        backward): it must write the same values."""
        for sample in self.samples(device, dtype):
            with torch.no_grad():
                plain = outputs_of(self.call(sample))
            grad_sample = sample.map(lambda t: t.detach().requires_grad_(differentiable(t)))
            for i, (g, p) in enumerate(zip(outputs_of(self.call(grad_sample)), plain, strict=True)):
                assert torch.equal(g.detach(), p), f"{sample}: output {i}"

    def test_gradients(self, device, dtype):
        for sample in self.samples(device, dtype):
            sample = sample.map(lambda t: t.detach().requires_grad_(differentiable(t)))
            sample64 = sample.map(lambda t: t.detach().double().requires_grad_(t.requires_grad))
            outs = outputs_of(self.call(sample))
            grads_out = [torch.randn_like(o) for o in outs]
            poison_cache(device, sum(t.numel() for t in sample.tensors()))
            leaves = [t for t in sample.tensors() if t.requires_grad]
            got = torch.autograd.grad(outs, leaves, grads_out, allow_unused=True)
            outs64 = outputs_of(self.call_reference(sample64))
            leaves64 = [t for t in sample64.tensors() if t.requires_grad]
            want = torch.autograd.grad(
                outs64, leaves64, [g.double() for g in grads_out], allow_unused=True
            )
            for i, (g, w, leaf) in enumerate(zip(got, want, leaves, strict=True)):
                if w is None:
                    assert g is None or not g.any(), f"{sample}: gradient {i}"
                    continue
                assert g.dtype == leaf.dtype and g.shape == leaf.shape, f"{sample}: gradient {i}"
                assert_close(g, w, self.grad_tolerance(sample, g), f"{sample}: gradient {i}")

    def test_gradcheck(self, device):
        for sample in self.gradcheck_samples(device):
            args = [
                a.detach().double().requires_grad_() if differentiable(a) else a
                for a in sample.args
            ]
            kwargs = sample.kwargs
            assert torch.autograd.gradcheck(
                lambda *args: self.call(Sample(args, kwargs)),  # noqa: B023 (called right here)
                args,
                check_forward_ad=self.check_forward_ad,
            )


class InferenceOpTests(OpTests):
    """An op without a backward (an in-place op, say): a clear error under autograd."""

    backward = False

    def test_inference_only_refuses_autograd(self, device):
        for sample in self.gradcheck_samples(device):
            sample = sample.map(lambda t: t.detach().requires_grad_(differentiable(t)))
            with pytest.raises(RuntimeError, match="no backward"):
                self.call(sample)
