"""Slow: each rendered variant, through its own nox sessions (the commands its README and CI use):
lint, then install into a fresh environment with the documented command and run its test suite;
for cpp also the GPU-less CUDA build."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
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
    """pytest's summary line in a nox session's output: enough tests passed and none failed."""
    summary = re.findall(r"=+ (.*(?:passed|failed).*) in [\d.]+s", output)[-1]
    print(summary)
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 130 and "failed" not in summary and "error" not in summary, summary


@pytest.mark.parametrize("variant", ["triton", "cpp"])
def test_rendered_project_lints_and_passes_its_tests(variant, tmp_path):
    project = render(tmp_path, variant=variant, package_name="acme_ops")
    output = nox(project, "lint", "tests")
    assert_suite_passed(output)
    # What is skipped is the CUDA half of the suite, with its reason, and nothing else.
    reasons = set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", output))
    assert reasons <= {"CUDA is not available"}, reasons


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
    assert "acme_ops/ops.py" in names
    if variant == "cpp":
        # The extension and the CPU kernels' libraries: for any CPU, and on x86-64 for AVX2.
        libraries = ["_C", "_cpu"] + (["_cpu_avx2"] if platform.machine() == "x86_64" else [])
        for library in libraries:
            assert any(re.fullmatch(rf"acme_ops/{library}\..*\.so", n) for n in names), names


def cpu_flags() -> set[str]:
    """The instruction-set flags of this machine's CPU (empty where /proc/cpuinfo has none)."""
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"^flags\s*:(.*)$", f.read(), re.MULTILINE)
    except OSError:
        return set()
    return set(found.group(1).split()) if found else set()


@pytest.mark.skipif(
    not {"avx2", "fma", "f16c"} <= cpu_flags(), reason="needs an x86-64 CPU with AVX2, FMA, F16C"
)
def test_cpp_cpu_kernels_for_any_cpu_pass_the_tests(tmp_path):
    """On this CPU the rendered suite runs the AVX2 kernels (test_rendered_project_lints_and_
    passes_its_tests); ATEN_CPU_CAPABILITY=default makes it run the kernels for any CPU. Only the
    AVX2 library holds AVX2 code."""
    project = render(tmp_path, variant="cpp", package_name="acme_ops")
    env = {**NOX_ENV, "ATEN_CPU_CAPABILITY": "default"}
    # Under ATEN_CPU_CAPABILITY=default, torch.compile's CPU code for dynamic shapes (torch 2.13)
    # uses at::vec without including it and fails to compile, whichever op it holds.
    output = nox(project, "tests", "--", "-k", "not compile_fullgraph_dynamic", env=env)
    assert_suite_passed(output)
    if shutil.which("objdump"):  # 256-bit registers: in the AVX2 library, and only there
        for name, want in (("_cpu_avx2", True), ("_cpu", False), ("_C", False)):
            (library,) = project.rglob(f"acme_ops/{name}.*.so")
            code = subprocess.run(["objdump", "-d", library], capture_output=True, text=True)
            assert ("%ymm" in code.stdout) == want, name


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
