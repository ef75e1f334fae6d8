"""Slow: each rendered variant, with an op added, through its README's install-and-test commands as
written (a fresh virtual environment) and its own nox sessions: lint, build, and for cpp the
GPU-less CUDA build."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest
import torch

from conftest import render

pytestmark = pytest.mark.slow

# Fresh environments get the torch running these tests, from TORCH_INDEX_URL if set, else from
# pip's own configuration.
NOX_ENV = {
    **os.environ,
    "TORCH_SPEC": f"torch=={torch.__version__.split('+')[0]}",
    "TORCH_INDEX_URL": os.environ.get("TORCH_INDEX_URL", ""),
}
# A CUDA build of torch for the cpp variant's CUDA compile (e.g. "torch==2.14.1"); needs nvcc.
CUDA_TORCH = os.environ.get("TEMPLATE_CUDA_TORCH")
# The README's `python` (and the guide's `nox`): those of the environment running these tests.
PATH = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"
# What a fresh 2-core machine may take from rendering to green tests, torch's download excluded
# (where the index is unreachable, pip installs the torch wheel from this machine's disk).
README_SECONDS = {"triton": 8 * 60, "cpp": 10 * 60}


def nox(project, *sessions, env=NOX_ENV, reuse=False, succeeds=True):
    """Runs the sessions (in the environments a previous run left, with reuse) and asserts
    whether they succeeded; returns their output."""
    result = subprocess.run(
        [sys.executable, "-m", "nox", "--no-color", *(["-r"] if reuse else []), "-s", *sessions],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    output = result.stdout + result.stderr
    print(output[-30000:])
    assert (result.returncode == 0) == succeeds, output[-8000:]
    return output


def assert_suite_passed(output: str) -> None:
    """pytest's summary line in the output: enough tests passed, none failed, no warnings."""
    summary = re.findall(r"=+ (.*(?:passed|failed).*) in [\d.]+s", output)[-1]
    print(summary)
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    # cpp's CPU suite passes 114 tests (a check loops over its cases), triton's more.
    assert passed >= 110 and "failed" not in summary and "error" not in summary, summary
    assert "warning" not in summary, summary  # none from the project's code or torch's deprecations


def guide_commands(project) -> str:
    """The shell commands of docs/adding_an_op.md: copy and rename rms_norm's files."""
    guide = (project / "docs" / "adding_an_op.md").read_text()
    (commands,) = re.findall(r"## 1\. Copy and rename.*?```bash\n(.*?)```", guide, re.S)
    return commands


def patch(path, old, new):
    text = path.read_text()
    assert old in text, f"{path.name}: {old!r} not found"
    path.write_text(text.replace(old, new))


def add_gemma_norm(project, variant):
    """Adds a new op as docs/adding_an_op.md says: its commands copy rms_norm's files as my_norm
    and list it in __init__.py, then the math changes to Gemma's RMSNorm, y = x * rstd * (1 +
    weight)."""
    env = {**NOX_ENV, "PATH": PATH}
    subprocess.run(["bash", "-euc", guide_commands(project)], cwd=project, check=True, env=env)
    pkg = project / "src" / "acme_ops"
    assert "from .my_norm import my_norm\nfrom .nn import" in (pkg / "__init__.py").read_text()
    # How the new ops run on DTensors: rms_norm's rules, a line per op.
    assert "ops.my_norm_bwd.default: ((ROWS," in (pkg / "sharding.py").read_text()
    op = pkg / "my_norm.py"
    patch(op, "y = y * weight.to(xf.dtype)", "y = y * (1 + weight.to(xf.dtype))")
    if variant == "cpp":
        # The CPU kernel reads the weight in the compute dtype; the new op hands it 1 + weight,
        # weight - (-1) with the stable ABI's ops (laid out as clang-format wants it).
        patch(project / "csrc" / "my_norm.cpp", "cpu::weight_or_ones(weight, x, acc_dtype)", GEMMA)
    else:
        patch(op, "dy * weight.to(ct)", "dy * (1 + weight.to(ct))")
        # The Triton kernels get 1 + weight as their weight; dw = sum(dy * x_hat) is unchanged.
        patch(
            pkg / "my_norm_kernels.py",
            "weight = weight.contiguous() if weight is not None else None",
            "weight = (1 + weight).contiguous() if weight is not None else None",
        )
    # Its tests: against the new reference, so a kernel that kept rms_norm's math fails them.
    test = project / "tests" / "test_my_norm.py"
    assert "my_norm_reference" in test.read_text()


GEMMA = """cpu::weight_or_ones(
      weight ? optional(torch::stable::subtract(
                   *weight, torch::stable::full({N}, -1.0, acc_dtype,
                                                std::nullopt, x.device())))
             : weight,
      x, acc_dtype)"""


def add_scaled_silu(project, variant):
    """Adds an op that is not a norm as docs/adding_an_op.md says: the commands of its §1 under
    the new name, then the changes of its §3 (one output, nothing extra to save): scaled_silu(x,
    alpha) = alpha * x * sigmoid(x), one op with register_autograd on it and a backward op,
    elementwise kernels, and a short test file on the harness of tests/op_tests.py."""
    commands = guide_commands(project)
    assert commands.startswith("op=my_norm Op=MyNorm\n")
    commands = commands.replace("op=my_norm Op=MyNorm", "op=scaled_silu Op=ScaledSilu", 1)
    env = {**NOX_ENV, "PATH": PATH}
    bash = ["bash", "-euc", commands]
    run = subprocess.run(bash, cwd=project, env=env, check=True, stdout=subprocess.PIPE, text=True)
    # The guide's last command lists the lines of the copies that still speak of rms_norm.
    assert re.search(r"^src/acme_ops/scaled_silu\.py:1:.*RMSNorm", run.stdout, re.M), run.stdout
    pkg = project / "src" / "acme_ops"
    if variant == "cpp":
        files = {"csrc/scaled_silu.cpp": SILU_CPP, "csrc/cuda/scaled_silu.cu": SILU_CU}
        module = SILU_HEAD_CPP + SILU_REFERENCE + SILU_FAKES + SILU_AUTOGRAD
    else:
        files = {"src/acme_ops/scaled_silu_kernels.py": SILU_KERNELS}
        module = SILU_HEAD_TRITON + SILU_REFERENCE + SILU_TRITON_OPS + SILU_AUTOGRAD
    files["src/acme_ops/scaled_silu.py"] = module
    files["tests/test_scaled_silu.py"] = silu_test(variant)
    for path, text in files.items():
        (project / path).write_text(text)
    # Its ops' lines in sharding.py, in place of the rms_norm ones that §1 copied.
    sharding = pkg / "sharding.py"
    rules = re.sub(r"^    ops\.scaled_silu.*\n", "", sharding.read_text(), flags=re.M)
    sharding.write_text(rules.replace("RULES = {\n", "RULES = {\n" + SILU_RULES, 1))


SILU_RULES = """\
    ops.scaled_silu.default: ((ROWS, None), (ROWS,)),
    ops.scaled_silu_bwd.default: ((ROWS, ROWS, None), (ROWS,)),
"""

SILU_HEAD_CPP = '''\
"""scaled_silu(x, alpha) = alpha * x * sigmoid(x), elementwise: one op, whose backward reads only
its input, and a backward op. Schemas and CPU kernels in ``csrc/scaled_silu.cpp``, CUDA kernels in
``csrc/cuda/scaled_silu.cu``."""

from __future__ import annotations

import torch

from ._checks import as_float, check_dtype, check_float_tensor, check_like, compute_dtype

'''

SILU_HEAD_TRITON = '''\
"""scaled_silu(x, alpha) = alpha * x * sigmoid(x), elementwise: one op, whose backward reads only
its input, and a backward op. CUDA tensors run the Triton kernels of ``scaled_silu_kernels.py``;
other devices the same math in PyTorch."""

from __future__ import annotations

import torch
from torch.library import triton_op

from . import scaled_silu_kernels as kernels
from ._checks import as_float, check_dtype, check_float_tensor, check_like, compute_dtype

'''

SILU_REFERENCE = '''\
ops = torch.ops.acme_ops


def scaled_silu_reference(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """In plain PyTorch, math in float32 (float64 for float64 ``x``)."""
    xf = x.to(compute_dtype(x))
    return (alpha * xf * torch.sigmoid(xf)).to(x.dtype)


'''

SILU_FAKES = """\
@torch.library.register_fake("acme_ops::scaled_silu")
def _(x, alpha):
    check_float_tensor("x", x)
    return x.new_empty(x.shape)


@torch.library.register_fake("acme_ops::scaled_silu_bwd")
def _(grad_y, x, alpha):
    check_float_tensor("x", x)
    check_like("grad_y", grad_y, "x", x)
    check_dtype("grad_y", grad_y, x.dtype, "x")
    return x.new_empty(x.shape)


"""

SILU_TRITON_OPS = """\
@triton_op("acme_ops::scaled_silu", mutates_args=())
def _scaled_silu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    check_float_tensor("x", x)
    if x.device.type != "cuda":
        return scaled_silu_reference(x, alpha).contiguous()
    return kernels.scaled_silu_fwd(x, alpha)


@triton_op("acme_ops::scaled_silu_bwd", mutates_args=())
def _scaled_silu_bwd(grad_y: torch.Tensor, x: torch.Tensor, alpha: float) -> torch.Tensor:
    check_float_tensor("x", x)
    check_like("grad_y", grad_y, "x", x)
    check_dtype("grad_y", grad_y, x.dtype, "x")
    if x.device.type != "cuda":
        xf = x.to(compute_dtype(x))
        s = torch.sigmoid(xf)
        return (grad_y * alpha * s * (1 + xf * (1 - s))).to(x.dtype).contiguous()
    return kernels.scaled_silu_bwd(grad_y, x, alpha)


"""

SILU_AUTOGRAD = '''\
def _setup_context(ctx, inputs, output):
    x, ctx.alpha = inputs
    ctx.save_for_backward(x)


def _backward(ctx, grad_y):
    (x,) = ctx.saved_tensors
    return ops.scaled_silu_bwd(grad_y, x, ctx.alpha), None  # None: no gradient for alpha


torch.library.register_autograd("acme_ops::scaled_silu", _backward, setup_context=_setup_context)


def scaled_silu(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``alpha * x * sigmoid(x)``, differentiable in ``x``; ``y`` has ``x``'s dtype."""
    check_float_tensor("x", x)
    return ops.scaled_silu(x, as_float("alpha", alpha))
'''

SILU_TEST = '''\
"""scaled_silu: the checks of every op (op_tests.py) on its samples."""

{pytest}import torch
from op_tests import {harness}

from acme_ops import {modules}
from acme_ops.scaled_silu import scaled_silu_reference


class TestScaledSilu(DifferentiableOpTests):
    function = staticmethod(scaled_silu)
    reference = staticmethod(scaled_silu_reference)
    namespace = torch.ops.acme_ops.name
    dtypes = [torch.float32, torch.bfloat16]

    def samples(self, device, dtype):
        for shape in [(7,), (3, 1000), (0, 8)]:  # the first, non-empty, for the CUDA graph
            yield Sample((torch.randn(shape, dtype=dtype, device=device), 1.5))
        yield Sample((torch.randn(40, 30, dtype=dtype, device=device).t(), -0.5))  # strided

    def gradcheck_samples(self, device):
        yield Sample((torch.randn(3, 17, device=device), 0.7))
        yield Sample((torch.randn(16, 6, device=device).t(), 2.0))

    def bad_calls(self):
        def call(x_dtype=torch.float32, alpha=1.0):
            return lambda device: Sample((torch.ones(4, device=device).to(x_dtype), alpha))

        return [
            BadCall(call(torch.int32), TypeError, "x must be float32.*got torch.int32$"),
            BadCall(call(alpha="2"), TypeError, "alpha must be a float"),
        ]
'''


def silu_test(variant):
    """The new op's test file as its author writes it: the harness's class, and for triton a test
    of the Triton kernels themselves."""
    if variant == "cpp":
        return SILU_TEST.format(
            pytest="", harness="BadCall, DifferentiableOpTests, Sample", modules="scaled_silu"
        )
    return (
        SILU_TEST.format(
            pytest="import pytest\n",
            harness="TOL, BadCall, DifferentiableOpTests, Sample, assert_close",
            modules="scaled_silu, scaled_silu_kernels",
        )
        + SILU_KERNELS_TEST
    )


SILU_KERNELS_TEST = """\


# The Triton kernels called directly: without a GPU, the tests that run them (see kernel_device).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_kernels(kernel_device, dtype):
    x = torch.randn(3, 1100, dtype=dtype, device=kernel_device)
    dy = torch.randn_like(x)
    x64 = x.double().requires_grad_()
    want = scaled_silu_reference(x64, 1.5)
    want.backward(dy.double())
    assert_close(scaled_silu_kernels.scaled_silu_fwd(x, 1.5), want, TOL[dtype])
    assert_close(scaled_silu_kernels.scaled_silu_bwd(dy, x, 1.5), x64.grad, TOL[dtype])
"""

SILU_CPP = """\
// scaled_silu(x, alpha) = alpha * x * sigmoid(x), elementwise: the op schemas
// and the CPU kernels.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>

#include "checks.h"
#include "cpu_blocks.h"

STABLE_TORCH_LIBRARY_FRAGMENT(acme_ops, m) {
  m.def("scaled_silu(Tensor x, float alpha) -> Tensor");
  m.def("scaled_silu_bwd(Tensor grad_y, Tensor x, float alpha) -> Tensor");
}

namespace acme_ops {
namespace {

Tensor scaled_silu(const Tensor& x_in, double alpha) {
  check_float_dtype("scaled_silu", "x", x_in.scalar_type());
  const Tensor x = as_contiguous(x_in);
  Tensor y = alloc_like(x, x.sizes());
  with_float_type(x.scalar_type(), [&](auto t) {
    using T = decltype(t);
    const acc_type<T> a(alpha);
    cpu::map_elements(
        x.numel(), y.mutable_data_ptr<T>(),
        [&](auto v) { return a * v / (1 + std::exp(-v)); },
        x.const_data_ptr<T>());
  });
  return y;
}

// d/dx alpha * x * s = alpha * s * (1 + x * (1 - s)), s = sigmoid(x).
Tensor scaled_silu_bwd(const Tensor& grad_y, const Tensor& x_in, double alpha) {
  constexpr const char* op = "scaled_silu_bwd";
  check_float_dtype(op, "x", x_in.scalar_type());
  check_like(op, "grad_y", grad_y, "x", x_in);
  check_dtype(op, "grad_y", grad_y, x_in.scalar_type(), "x");
  const Tensor x = as_contiguous(x_in);
  const Tensor dy = as_contiguous(grad_y);
  Tensor dx = alloc_like(x, x.sizes());
  with_float_type(x.scalar_type(), [&](auto t) {
    using T = decltype(t);
    const acc_type<T> a(alpha);
    cpu::map_elements(
        x.numel(), dx.mutable_data_ptr<T>(),
        [&](auto g, auto v) {
          const auto s = 1 / (1 + std::exp(-v));
          return g * a * s * (1 + v * (1 - s));
        },
        dy.const_data_ptr<T>(), x.const_data_ptr<T>());
  });
  return dx;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(acme_ops, CPU, m) {
  m.impl("scaled_silu", TORCH_BOX(&scaled_silu));
  m.impl("scaled_silu_bwd", TORCH_BOX(&scaled_silu_bwd));
}

}  // namespace acme_ops
"""

SILU_CU = """\
// CUDA kernels of scaled_silu and scaled_silu_bwd (schemas in
// ../scaled_silu.cpp): a thread per element, in a grid-stride loop.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/macros.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>

#include "../checks.h"
#include "blocks.cuh"

namespace acme_ops {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void scaled_silu_kernel(const T* __restrict__ x, T* __restrict__ y,
                                   int64_t n, acc_type<T> alpha) {
  using acc_t = acc_type<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const acc_t v = acc_t(x[i]);
    y[i] = T(alpha * v / (1 + exp(-v)));
  }
}

template <typename T>
__global__ void scaled_silu_bwd_kernel(const T* __restrict__ dy,
                                       const T* __restrict__ x,
                                       T* __restrict__ dx, int64_t n,
                                       acc_type<T> alpha) {
  using acc_t = acc_type<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const acc_t v = acc_t(x[i]);
    const acc_t s = 1 / (1 + exp(-v));
    dx[i] = T(acc_t(dy[i]) * alpha * s * (1 + v * (1 - s)));
  }
}

// Blocks for n elements, capped: the grid-stride loop covers the rest.
unsigned blocks_for(int64_t n) {
  return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
}

Tensor scaled_silu(const Tensor& x_in, double alpha) {
  check_float_dtype("scaled_silu", "x", x_in.scalar_type());
  const torch::stable::accelerator::DeviceGuard guard(x_in.get_device_index());
  const Tensor x = as_contiguous(x_in);
  Tensor y = alloc_like(x, x.sizes());
  const int64_t n = x.numel();
  if (n == 0) {
    return y;
  }
  with_float_type(x.scalar_type(), [&](auto t) {
    using T = decltype(t);
    scaled_silu_kernel<T><<<blocks_for(n), kThreads, 0, current_stream(x)>>>(
        x.const_data_ptr<T>(), y.mutable_data_ptr<T>(), n, acc_type<T>(alpha));
    STD_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

Tensor scaled_silu_bwd(const Tensor& grad_y, const Tensor& x_in, double alpha) {
  constexpr const char* op = "scaled_silu_bwd";
  check_float_dtype(op, "x", x_in.scalar_type());
  check_like(op, "grad_y", grad_y, "x", x_in);
  check_dtype(op, "grad_y", grad_y, x_in.scalar_type(), "x");
  const torch::stable::accelerator::DeviceGuard guard(x_in.get_device_index());
  const Tensor x = as_contiguous(x_in);
  const Tensor dy = as_contiguous(grad_y);
  Tensor dx = alloc_like(x, x.sizes());
  const int64_t n = x.numel();
  if (n == 0) {
    return dx;
  }
  with_float_type(x.scalar_type(), [&](auto t) {
    using T = decltype(t);
    scaled_silu_bwd_kernel<T>
        <<<blocks_for(n), kThreads, 0, current_stream(x)>>>(
            dy.const_data_ptr<T>(), x.const_data_ptr<T>(),
            dx.mutable_data_ptr<T>(), n, acc_type<T>(alpha));
    STD_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return dx;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(acme_ops, CUDA, m) {
  m.impl("scaled_silu", TORCH_BOX(&scaled_silu));
  m.impl("scaled_silu_bwd", TORCH_BOX(&scaled_silu_bwd));
}

}  // namespace acme_ops
"""

SILU_KERNELS = '''\
"""scaled_silu's Triton kernels, a block of elements a program, and the functions that launch
them. Math in float32 (float64 for float64)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .blocks import wrap

BLOCK = 1024


@triton.jit
def _fwd_kernel(X, Y, n, alpha: tl.float64, BLOCK: tl.constexpr):
    DTYPE: tl.constexpr = tl.float64 if X.dtype.element_ty == tl.float64 else tl.float32
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X + offsets, mask=mask).to(DTYPE)
    y = (alpha * x).to(DTYPE) / (1 + tl.exp(-x))  # alpha: float64, as passed
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(DY, X, DX, n, alpha: tl.float64, BLOCK: tl.constexpr):
    DTYPE: tl.constexpr = tl.float64 if X.dtype.element_ty == tl.float64 else tl.float32
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X + offsets, mask=mask).to(DTYPE)
    s = 1 / (1 + tl.exp(-x))
    dx = tl.load(DY + offsets, mask=mask).to(DTYPE) * (alpha * s).to(DTYPE) * (1 + x * (1 - s))
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)


def scaled_silu_fwd(x: Tensor, alpha: float) -> Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    if x.numel() > 0:
        wrap(_fwd_kernel)[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), alpha, BLOCK=BLOCK)
    return y


def scaled_silu_bwd(grad_y: Tensor, x: Tensor, alpha: float) -> Tensor:
    grad_y, x = grad_y.contiguous(), x.contiguous()
    dx = torch.empty_like(x)
    if x.numel() > 0:
        grid = (triton.cdiv(x.numel(), BLOCK),)
        wrap(_bwd_kernel)[grid](grad_y, x, dx, x.numel(), alpha, BLOCK=BLOCK)
    return dx
'''


def readme_commands(project) -> str:
    """The bash block of the README's "Install and test" section, the one block there."""
    readme = (project / "README.md").read_text()
    (section,) = re.findall(r"^## Install and test\n(.*?)^## ", readme, re.S | re.M)
    (commands,) = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    return commands


def readme_use_code(project) -> str:
    """The Python block of the README's "Use" section."""
    readme = (project / "README.md").read_text()
    (section,) = re.findall(r"^## Use\n(.*?)^## ", readme, re.S | re.M)
    (code,) = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    return code


def run_readme_commands(project, tmp_path) -> str:
    """Runs them as written in the project directory and returns their output. Only the
    environment differs: pip installs the torch running these tests, and gives up at once on an
    index it cannot reach (it then falls back to the other indexes of its configuration)."""
    constraint = tmp_path / "torch-constraint.txt"
    constraint.write_text(NOX_ENV["TORCH_SPEC"] + "\n")
    env = {
        **os.environ,
        "PATH": PATH,
        "PIP_CONSTRAINT": str(constraint),
        "PIP_RETRIES": "0",
        "PYTEST_ADDOPTS": "-rfEp",  # a line per passed test too
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_commands(project)],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    print(result.stdout[-30000:])
    assert result.returncode == 0, result.stdout[-8000:]
    return result.stdout


@pytest.mark.parametrize("variant", ["triton", "cpp"])
def test_rendered_project_with_an_added_op_lints_and_passes_its_readme_commands(variant, tmp_path):
    """The rendered project after following docs/adding_an_op.md: its lint session, then its
    README's install-and-test commands as written, in time on a 2-core machine."""
    start = time.monotonic()
    project = render(tmp_path, variant=variant, package_name="acme_ops")
    seconds = time.monotonic() - start
    add_gemma_norm(project, variant)
    add_scaled_silu(project, variant)
    nox(project, "lint")
    if variant == "cpp":
        # The new ops' CUDA kernels compile, as its guide says to check, with no GPU or CUDA
        # toolkit (one architecture is enough for that).
        cuda_check = {**NOX_ENV, "TORCH_CUDA_ARCH_LIST": "8.0"}
        output = nox(project, "cuda_check", env=cuda_check)
        for op in ("my_norm", "scaled_silu"):
            assert re.search(rf"^\[\d+/\d+\] .* \S*csrc/cuda/{op}\.cu ", output, re.M), op
        # The check (and the CUDA build) also fails on register spills, which launch bounds can
        # cause: add a kernel that spills (16 float4 a thread held in 32 registers). The rerun
        # compiles that file alone.
        spills = project / "csrc" / "cuda" / "spills.cu"
        spills.write_text(SPILLING_KERNEL)
        output = nox(project, "cuda_check", env=cuda_check, reuse=True, succeeds=False)
        assert "Registers are spilled to local memory" in output
        assert not re.search(r"^\[\d+/\d+\] .* \S*csrc/cuda/my_norm\.cu ", output, re.M)
        spills.unlink()
    start = time.monotonic()
    output = run_readme_commands(project, tmp_path)
    seconds += time.monotonic() - start
    print(f"{variant}: render and README commands took {seconds:.0f} s")
    assert seconds < README_SECONDS[variant], f"{seconds:.0f} s"
    assert_suite_passed(output)
    # The README's "Use" example runs as written in the environment its commands made.
    python = project / ".venv" / "bin" / "python"
    subprocess.run([python, "-c", readme_use_code(project)], cwd=project, check=True)
    # The new ops' tests ran and passed: values, gradients, opcheck, torch.compile, bad calls, and
    # in Triton their kernels, through the interpreter, against the new references.
    for op, cls in (("my_norm", "TestMyNorm"), ("scaled_silu", "TestScaledSilu")):
        ran = re.findall(rf"^PASSED tests/test_{op}\.py::(\S+)", output, re.M)
        for name in (
            f"{cls}::test_values",
            f"{cls}::test_gradients",
            f"{cls}::test_gradcheck",
            f"{cls}::test_opcheck",
            f"{cls}::test_compile_fullgraph",
            f"{cls}::test_bad_calls",
            *(["test_kernels"] if variant == "triton" else []),
        ):
            assert any(t.startswith(name) for t in ran), (op, name)
    # What is skipped is the CUDA half of the suite, summed up in one line.
    assert re.search(
        r"^\d+ tests skipped: they need a GPU and CUDA is not available$", output, re.M
    )
    assert "SKIPPED" not in output
    if variant == "cpp":
        # The build shows its progress, a [k/n] line per compiled file, and no compiler warning.
        for op in ("my_norm", "scaled_silu"):
            assert re.search(rf"^ *\[\d+/\d+\] .* \S*csrc/{op}\.cpp ", output, re.M), op
        assert ": warning:" not in output and "Failed to initialize NumPy" not in output


@pytest.mark.parametrize("variant", ["triton", "cpp"])
def test_rendered_build_gives_a_complete_sdist_and_a_wheel(variant, tmp_path):
    project = render(tmp_path, variant=variant, package_name="acme_ops")
    # Every source a build from the sdist compiles or imports: a CUDA build from an sdist that
    # lacks one of its headers fails only where nvcc runs, so no CPU test would notice.
    sources = [p for d in ("csrc", "src") for p in (project / d).rglob("*") if p.is_file()]
    nox(project, "build")
    (sdist,) = (project / "dist").glob("*.tar.gz")
    (wheel,) = (project / "dist").glob("*.whl")
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    missing = sorted(str(p.relative_to(project)) for p in sources)
    missing = [p for p in missing if p not in in_sdist]
    assert not missing, f"not in the sdist: {missing}"
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
    assert "acme_ops/rms_norm.py" in names
    if variant == "cpp":
        # One wheel for every Python from python_min on; the CPU build of torch: _C alone.
        assert wheel.name.endswith("-cp310-abi3-linux_x86_64.whl"), wheel.name
        assert "acme_ops/_C.abi3.so" in names and "acme_ops/_C_cuda.abi3.so" not in names, names


@pytest.mark.skipif(
    not (CUDA_TORCH and shutil.which("nvcc")),
    reason="needs nvcc and TEMPLATE_CUDA_TORCH naming a CUDA build of torch",
)
def test_cpp_cuda_build_without_a_gpu(tmp_path):
    project = render(tmp_path, variant="cpp", package_name="acme_ops")
    # One architecture: the added-op test's cuda_check compiles every kernel for sm_80 (and shows
    # that a kernel that spills fails it, as it fails this build); this build links and loads
    # them for sm_90.
    env = {**NOX_ENV, "TORCH_SPEC": CUDA_TORCH, "TORCH_CUDA_ARCH_LIST": "9.0"}
    output = nox(project, "cuda_build", env=env)
    assert "CUDA kernels registered" in output


SPILLING_KERNEL = """
__global__ void __launch_bounds__(1024, 2) spills(const float4* x, float4* y, int n) {
  float4 v[16];
  float s = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = x[threadIdx.x + i * n];
    s += v[i].x * v[i].y + v[i].z * v[i].w;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    y[threadIdx.x + i * n] = make_float4(v[i].x * s, v[i].y * s, v[i].z * s, v[i].w * s);
  }
}
"""
