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
    assert passed >= 130 and "failed" not in summary and "error" not in summary, summary
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
    nox(project, "lint")
    if variant == "cpp":
        # The new op's CUDA kernels compile, as its guide says to check, with no GPU or CUDA
        # toolkit (one architecture is enough for that).
        output = nox(project, "cuda_check", env={**NOX_ENV, "TORCH_CUDA_ARCH_LIST": "8.0"})
        assert re.search(r"^\[\d+/\d+\] .* \S*csrc/cuda/my_norm\.cu ", output, re.M)
    start = time.monotonic()
    output = run_readme_commands(project, tmp_path)
    seconds += time.monotonic() - start
    print(f"{variant}: render and README commands took {seconds:.0f} s")
    assert seconds < README_SECONDS[variant], f"{seconds:.0f} s"
    assert_suite_passed(output)
    # The README's "Use" example runs as written in the environment its commands made.
    python = project / ".venv" / "bin" / "python"
    subprocess.run([python, "-c", readme_use_code(project)], cwd=project, check=True)
    # The new op's tests ran and passed: values, gradients, opcheck, torch.compile, and in Triton
    # its kernels, through the interpreter, against the new reference.
    ran = re.findall(r"^PASSED tests/test_my_norm\.py::(\S+)", output, re.M)
    for name in (
        "TestMyNorm::test_values",
        "TestMyNorm::test_gradients",
        "TestMyNorm::test_gradcheck",
        "TestMyNorm::test_opcheck",
        "TestMyNorm::test_compile_fullgraph",
        *(["test_kernels"] if variant == "triton" else []),
    ):
        assert any(t.startswith(name) for t in ran), name
    # What is skipped is the CUDA half of the suite, summed up in one line.
    assert re.search(
        r"^\d+ tests skipped: they need a GPU and CUDA is not available$", output, re.M
    )
    assert "SKIPPED" not in output
    if variant == "cpp":
        # The build shows its progress, a [k/n] line per compiled file, and no compiler warning.
        assert re.search(r"^ *\[\d+/\d+\] .* \S*csrc/my_norm\.cpp ", output, re.M)
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
    # The rendered default architectures (sm_80 and sm_90), as the rendered CI builds them.
    env = {**NOX_ENV, "TORCH_SPEC": CUDA_TORCH}
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    output = nox(project, "cuda_build", env=env)
    assert "CUDA kernels registered" in output
    # The session also fails on register spills, which launch bounds can cause: add a kernel that
    # spills (16 float4 a thread held in 32 registers) and rebuild.
    (project / "csrc" / "cuda" / "spills.cu").write_text(SPILLING_KERNEL)
    output = nox(project, "cuda_build", env=env, reuse=True, succeeds=False)
    assert "Registers are spilled to local memory" in output


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
