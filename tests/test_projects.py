"""Slow: install each rendered variant into a fresh virtual environment with the documented
command, then run the project's own test suite (and, for cpp with a CUDA torch, a CUDA build)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import render

pytestmark = pytest.mark.slow

# The torch running these tests is the one each fresh environment gets ("an environment that has torch").
TORCH_SPEC = f"torch=={torch.__version__.split('+')[0]}"


def run(cmd, cwd=None, env=None, timeout=1800):
    result = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    print(result.stdout[-20000:], result.stderr[-20000:], sep="\n")
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-5000:]}\n{result.stderr[-5000:]}"
    return result


def fresh_venv(path: Path, *packages: str) -> Path:
    run([sys.executable, "-m", "venv", path])
    python = path / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", TORCH_SPEC, "setuptools>=77", "wheel", *packages])
    return python


def install_documented(python: Path, project: Path, env=None):
    # The command the rendered README gives.
    run([python, "-m", "pip", "install", "--no-build-isolation", "-e", ".[test]"], project, env)


@pytest.mark.parametrize("variant", ["triton", "cpp"])
def test_rendered_project_passes_its_own_tests(variant, tmp_path):
    project = render(tmp_path, variant=variant, package_name="acme_ops")
    python = fresh_venv(tmp_path / "venv", *(["ninja"] if variant == "cpp" else []))
    install_documented(python, project)
    result = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], project)
    summary = result.stdout.strip().splitlines()[-1]
    print(f"{variant}: {summary}")
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 150 and "failed" not in summary and "error" not in summary
    # Skips are only the CUDA half of the suite, each with its reason.
    skip_reasons = set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", result.stdout))
    assert skip_reasons <= {"CUDA is not available"}, skip_reasons


CUDA_PYTHON = os.environ.get("TEMPLATE_CUDA_PYTHON")


@pytest.mark.skipif(
    not CUDA_PYTHON, reason="set TEMPLATE_CUDA_PYTHON to a Python whose torch is a CUDA build"
)
def test_cpp_builds_cuda_kernels_without_a_gpu(tmp_path):
    project = render(tmp_path, variant="cpp", package_name="acme_ops")
    env = {**os.environ, "REQUIRE_CUDA": "1", "TORCH_CUDA_ARCH_LIST": "9.0"}
    install_documented(Path(CUDA_PYTHON), project, env)
    check = (
        "import torch, acme_ops, acme_ops._C as C\n"
        "assert C.cuda_compiled and acme_ops._library.CUDA_BUILT\n"
        "for op in ('rms_norm_fwd', 'rms_norm_bwd'):\n"
        "    for key in ('CPU', 'CUDA'):\n"
        "        assert torch._C._dispatch_has_kernel_for_dispatch_key(f'acme_ops::{op}', key), (op, key)\n"
        "print('CUDA kernels registered; GPU visible:', torch.cuda.is_available())\n"
    )
    out = run([CUDA_PYTHON, "-c", check], tmp_path, env).stdout
    assert "CUDA kernels registered" in out
    run([CUDA_PYTHON, "-m", "pip", "uninstall", "-y", "acme-ops"])
