"""Slow, and run apart from the rest (pytest -m wheel; the template's GitHub workflow runs it): the
cpp variant's wheels, built once and installed as a user would install them. The CPU wheel, built
with the torch running these tests, passes the rendered project's tests in fresh environments with
torch_min (2.11) and the newest torch (CUDA builds, no GPU needed), run from a copy of its tests so
that what they import is the installed wheel, not the source tree; and the CUDA wheel, built with
a CUDA torch and nvcc from PyPI, registers a CUDA kernel for every op under torch 2.11."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_projects import NOX_ENV, assert_suite_passed, nox

from conftest import render

pytestmark = [pytest.mark.slow, pytest.mark.wheel]

OLDEST = "torch==2.11.0"  # the rendered torch_min
NEWEST = os.environ.get("TEMPLATE_CUDA_TORCH", "torch==2.14.1")
PACKAGE = "acme_ops"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return render(tmp_path_factory.mktemp("wheel"), variant="cpp", package_name=PACKAGE)


@pytest.fixture(scope="module")
def cpu_wheel(project):
    """Built by the project's nox -s wheel (its tags, abi3audit and import checked there)."""
    output = nox(project, "wheel")
    assert "imported the installed wheel" in output
    (wheel,) = (project / "dist").glob("*.whl")
    assert "-cp310-abi3-manylinux_" in wheel.name, wheel.name
    return wheel


@pytest.fixture(scope="module")
def cuda_wheel(project, cpu_wheel):
    """nox -s wheel with a CUDA torch, as the release workflow builds it: nvcc from PyPI, the
    local version +cu130."""
    # torch from pip's own configuration, whose default index has CUDA builds.
    env = {**NOX_ENV, "TORCH_SPEC": NEWEST, "TORCH_INDEX_URL": "", "LOCAL_VERSION": "cu130"}
    env.pop("CUDA_HOME", None)  # nvcc from PyPI, not a CUDA toolkit of this machine
    output = nox(project, "wheel", env=env)
    assert "CUDA kernels registered for every op" in output
    shutil.rmtree(project / ".nox")  # GBs
    (wheel,) = (project / "dist").glob("*+cu130-*.whl")
    return wheel


@pytest.fixture(scope="module")
def oldest_torch(tmp_path_factory):
    """torch 2.11 and what it needs, downloaded once for the environments that install it."""
    wheelhouse = tmp_path_factory.mktemp("torch-2.11")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "download", "-q", "-d", wheelhouse, OLDEST], check=True)
    return wheelhouse


@pytest.fixture
def venv(tmp_path):
    """Where a test makes its environment, removed after it (GBs each)."""
    yield tmp_path / "venv"
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


def fresh_env(path: Path, torch_spec: str, wheel: Path, wheelhouse: Path | None = None) -> Path:
    """A new virtual environment with torch_spec (from pip's own configuration, or the
    wheelhouse), then the wheel and its test extras; returns its Python."""
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    pip = [path / "bin" / "python", "-m", "pip", "install", "-q"]
    local = ["--no-index", "--find-links", wheelhouse] if wheelhouse else []
    subprocess.run([*pip, *local, torch_spec], check=True)
    subprocess.run([*pip, f"{wheel}[test]"], check=True)
    return path / "bin" / "python"


def copy_of_tests(project: Path, where: Path) -> Path:
    """The project's tests and what they read, without src/ or the package's sources."""
    for name in ("tests", "benchmarks"):
        shutil.copytree(project / name, where / name)
    shutil.copy(project / "pyproject.toml", where)
    return where


# A line per passed test, to look for tests by name.
PYTEST = ["-m", "pytest", "-p", "no:cacheprovider", "-rfEp"]


def run(python: Path, *args: str, cwd: Path) -> str:
    result = subprocess.run(
        [python, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    print(result.stdout[-20000:])
    assert result.returncode == 0, result.stdout[-8000:]
    return result.stdout


# The hidden-size sweep of tests/test_hidden_sizes.py, on the CPU (the test runs it on a GPU).
SWEEP_ON_CPU = """
import sys
import torch
sys.path.insert(0, "tests")
from test_hidden_sizes import ALIGN_SIZES, DTYPES, MODEL_SIZES, ODD_SIZES, close
from acme_ops import fused_add_rms_norm, rms_norm
from acme_ops.fused_add_rms_norm import fused_add_rms_norm_reference
from acme_ops.rms_norm import rms_norm_reference

torch.manual_seed(0)
sizes = sorted(set(MODEL_SIZES + ODD_SIZES + ALIGN_SIZES))
for n in sizes:
    for dtype in DTYPES:
        x, r = (torch.randn(4, n, dtype=dtype, requires_grad=True) for _ in range(2))
        w = (torch.rand(n, dtype=dtype) + 0.5).requires_grad_()
        x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
        y = rms_norm(x, w)
        y.sum().backward()
        want = rms_norm_reference(x64, w64)
        want.sum().backward()
        close(y, want, dtype)
        close(x.grad, x64.grad, dtype)
        close(w.grad, w64.grad, dtype, rows=4)
        y, h = fused_add_rms_norm(x, r, w)
        want_y, want_h = fused_add_rms_norm_reference(x64, r64, w64)
        close(y, want_y, dtype)
        close(h, want_h, dtype)
print(f"{len(sizes)} hidden sizes match the float64 reference on the CPU")
"""

WHERE_AND_KERNELS = f"""
import torch
import {PACKAGE}
print("imported from", {PACKAGE}.__file__)
ops = sorted(
    name for name in torch._C._dispatch_get_all_op_names() if name.startswith("{PACKAGE}::")
)
print("CUDA kernels for", [
    name for name in ops if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA")
], "of", ops)
print("cuda_built:", {PACKAGE}.cuda_built())
"""


@pytest.mark.parametrize("torch_spec", [OLDEST, NEWEST])
def test_cpu_wheel_passes_the_tests_installed_with(
    torch_spec, cpu_wheel, oldest_torch, venv, tmp_path
):
    python = fresh_env(venv, torch_spec, cpu_wheel, oldest_torch if torch_spec == OLDEST else None)
    tests = copy_of_tests(cpu_wheel.parents[1], tmp_path / "project")
    out = run(python, "-c", "import torch; print('torch', torch.__version__)", cwd=tests)
    assert f"torch {torch_spec.split('==')[1]}" in out
    out = run(python, "-c", WHERE_AND_KERNELS, cwd=tests)
    assert f"imported from {venv}" in out and "cuda_built: False" in out
    # Every test file, opcheck, gradcheck and torch.compile(fullgraph=True) among them, against
    # the installed wheel.
    output = run(python, *PYTEST, cwd=tests)
    # torch 2.11's own modules warn (its profiler, its export loader); nothing else may.
    warned = re.findall(r"^  (\S+):\d+: \w*Warning", output, re.M)
    assert all("/site-packages/torch/" in path for path in warned), warned
    assert_suite_passed(re.sub(r", \d+ warnings?", "", output))
    for name in ("test_opcheck", "test_gradcheck", "test_compile_fullgraph_dynamic"):
        assert f"PASSED tests/test_rms_norm.py::TestRmsNorm::{name}" in output, name
    assert "SKIPPED" not in output  # the CUDA half is summed up in one line
    assert "hidden sizes match" in run(python, "-c", SWEEP_ON_CPU, cwd=tests)


def test_cuda_wheel_registers_its_cuda_kernels_under_torch_2_11(
    cuda_wheel, oldest_torch, venv, tmp_path
):
    python = fresh_env(venv, OLDEST, cuda_wheel, oldest_torch)
    tests = copy_of_tests(cuda_wheel.parents[1], tmp_path / "project")
    out = run(python, "-c", WHERE_AND_KERNELS, cwd=tests)
    assert f"imported from {venv}" in out and "cuda_built: True" in out
    kernels, ops = out.split("CUDA kernels for ")[1].split("\n")[0].split(" of ")
    assert kernels == ops and f"'{PACKAGE}::rms_norm_fwd'" in ops, out
    # The project's own check of the same, and the rest of that file, against the installed wheel.
    output = run(python, *PYTEST, "tests/test_extension.py", cwd=tests)
    assert "PASSED tests/test_extension.py::test_every_op_has_its_kernels" in output
