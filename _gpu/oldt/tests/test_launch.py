"""The launch cache must pick the compiled kernel Triton itself would pick.

``_launch`` keys its cache on what Triton specializes a kernel on. If a Triton release
specializes on more (a new alignment class, say), two calls could share a cached kernel that
Triton would have compiled apart. The first test asks the installed Triton: any two sample
arguments that get the same cache key must get the same Triton specialization. The last
alternates aligned and unaligned inputs of one shape, so that on a GPU calls hit the cache, miss
it and hit it again, and checks every result.
"""

import itertools

import pytest
import torch

from oldt_ops import reference, rms_norm

triton = pytest.importorskip("triton")
triton_c = pytest.importorskip("triton._C.libtriton")
BaseBackend = pytest.importorskip("triton.backends.compiler").BaseBackend
_launch = pytest.importorskip("oldt_ops._launch")


def _samples():
    """(description, argument) pairs: tensors at several alignments, ints, floats, None."""
    tensors = []
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.empty(64, dtype=dtype)
        tensors += [(f"{dtype} at +{k} elements", base[k:]) for k in (0, 1, 4, 8)]
    ints = [0, 1, 2, 15, 16, 17, 32, 4096, 4097, 2**31 - 16, 2**31, 2**31 + 16, 2**40, -1, -16]
    return [*tensors, *((repr(v), v) for v in (*ints, 1e-6, 0.5, None))]


def _triton_specialization(arg):
    # The same call Triton's generated argument binder makes for a parameter with no
    # annotation and default specialization.
    return triton_c.native_specialize_impl(BaseBackend, arg, False, True, True)


def test_cache_key_is_at_least_as_fine_as_tritons():
    for (name_a, a), (name_b, b) in itertools.combinations(_samples(), 2):
        if _launch._args_key((a,)) == _launch._args_key((b,)):
            assert _triton_specialization(a) == _triton_specialization(b), (name_a, name_b)


def test_launch_hooks_are_seen():
    # Unset, the cached path runs; with a hook (a profiler's), every launch goes through Triton.
    assert not _launch._hooks_set()
    chain = triton.knobs.runtime.launch_enter_hook
    hook = lambda metadata: None  # noqa: E731
    chain.add(hook)
    try:
        assert _launch._hooks_set()
    finally:
        chain.remove(hook)
    assert not _launch._hooks_set()


def test_launcher_needs_constexprs_last():
    # A compiled kernel's launcher takes the constexprs after the runtime arguments.
    @triton.jit
    def kernel(x_ptr, BLOCK: triton.language.constexpr, n):
        pass

    with pytest.raises(ValueError, match="constexprs must be its last parameters"):
        _launch.Launcher(kernel, BLOCK=16)


def test_alternating_alignment_matches_reference(device):
    m, n = 6, 1000
    buf = torch.randn(m * n + 8, device=device)
    w = torch.randn(n, device=device, requires_grad=True)
    dy = torch.randn(m, n, device=device)
    for offset in (0, 1, 0, 4, 1, 0):  # elements: 1 leaves the data pointer unaligned
        x = buf[offset : offset + m * n].view(m, n).detach().requires_grad_()
        y = rms_norm(x, w)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
        y64 = reference.rms_norm(x64, w64, 1e-6)
        dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
        for got, want in ((y, y64), (dx, dx64), (dw, dw64)):
            torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
