"""Fast checks of the rendered output: files, leftover Jinja, lint, hook refusals, odd answers."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from cookiecutter.exceptions import FailedHookException

from conftest import VARIANTS, render

COMMON = {
    "README.md",
    "LICENSE",
    ".gitignore",
    ".pre-commit-config.yaml",
    "pyproject.toml",
    "src/{pkg}/__init__.py",
    "src/{pkg}/_checks.py",
    "src/{pkg}/rms_norm.py",
    "src/{pkg}/fused_add_rms_norm.py",
    "src/{pkg}/nn.py",
    "src/{pkg}/sharding.py",
    "tests/conftest.py",
    "tests/op_tests.py",
    "tests/test_distributed.py",
    "tests/test_rms_norm.py",
    "tests/test_edge_cases.py",
    "tests/test_fused_add_rms_norm.py",
    "tests/test_nn.py",
    "tests/test_replace_rms_norm.py",
    "tests/test_export.py",
    "tests/test_hidden_sizes.py",
    "tests/test_benchmark.py",
    "benchmarks/bench_rms_norm.py",
    "benchmarks/bench_model.py",
    "noxfile.py",
    "docs/adding_an_op.md",
    ".github/workflows/ci.yml",
    ".github/workflows/release.yml",
    ".github/dependabot.yml",
    ".github/zizmor.yml",
}
ONLY = {
    "cpp": {
        "setup.py",
        "MANIFEST.in",
        ".clang-format",
        "csrc/checks.h",
        "csrc/cpu_blocks.h",
        "csrc/module.cpp",
        "csrc/rms_norm.cpp",
        "csrc/fused_add_rms_norm.cpp",
        "csrc/cuda/blocks.cuh",
        "csrc/cuda/rms_norm.cu",
        "csrc/cuda/fused_add_rms_norm.cu",
        "src/{pkg}/_extension.py",
        "tests/test_extension.py",
    },
    "triton": {
        "src/{pkg}/blocks.py",
        "src/{pkg}/rms_norm_kernels.py",
        "src/{pkg}/fused_add_rms_norm_kernels.py",
    },
}
JINJA = re.compile(r"\{\{|\}\}|\{%|%\}|\{#|cookiecutter")


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def expected_files(variant: str, pkg: str) -> set[str]:
    return {f.format(pkg=pkg) for f in COMMON | ONLY[variant]}


def ruff(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
        cwd=project,
        capture_output=True,
        text=True,
    )


def assert_lint_clean(project: Path) -> None:
    for args in (["check"], ["format", "--check"]):
        result = ruff(project, *args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_variant_files_and_only_those(project, variant):
    present = files(project)
    assert present == expected_files(variant, "my_torch_ops")
    other = next(v for v in VARIANTS if v != variant)
    assert not any(f in present for f in ONLY[other] - ONLY[variant])
    assert not [d for d in project.rglob("*") if d.is_dir() and not any(d.iterdir())]


def test_no_leftover_jinja(project):
    leftovers = [
        f"{p}: {line.strip()}"
        for p in project.rglob("*")
        if p.is_file()
        for line in p.read_text().splitlines()
        if JINJA.search(line) and "${{" not in line
    ]
    assert not leftovers, "\n".join(leftovers)


# Private or internal APIs that can change in any torch or Triton release: no rendered file a user
# keeps (tests aside, which may inspect internals) may use them.
PRIVATE_APIS = re.compile(
    # torch._C, torch._dynamo, torch._library, ...; not AOTInductor's documented entry points
    r"torch\._(?!inductor\.aoti_(compile_and_package|load_package)\b)[A-Za-z]"
    r"|from torch import _"
    r"|forward_ad\._"
    # torch's C++ internals; not the LibTorch stable ABI's headers (its C++ API and the C shim)
    r"|#include\s*<torch/csrc/(?!stable/|inductor/aoti_torch/c/shim\.h>)"
    r"|triton\.(knobs|runtime|compiler|backends)"
    r"|packed_metadata|launch_metadata|\.run\(grid"
)


def test_no_private_apis(project):
    hits = [
        f"{p.relative_to(project)}:{i}: {line.strip()}"
        for p in project.rglob("*")
        if p.is_file() and "tests" not in p.relative_to(project).parts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if PRIVATE_APIS.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_no_private_apis_pattern_catches_them():
    for line in [
        "torch._C._get_tracing_state()",
        "#include <torch/csrc/autograd/x.h>",
        "triton.knobs.runtime",
        "forward_ad._current_level",
        "compiled.packed_metadata",
        "torch._inductor.config",
    ]:
        assert PRIVATE_APIS.search(line), line
    assert not PRIVATE_APIS.search("torch.library.triton_op")
    assert not PRIVATE_APIS.search("#include <torch/csrc/stable/library.h>")
    assert not PRIVATE_APIS.search("#include <torch/csrc/inductor/aoti_torch/c/shim.h>")


# What csrc/ may include from torch: the LibTorch stable ABI only (its C++ API, the header-only
# types and macros, and the C shim), so that one build loads into every torch from torch_min on.
STABLE_INCLUDE = re.compile(
    r"torch/csrc/stable/.*|torch/headeronly/.*|torch/csrc/inductor/aoti_torch/c/shim\.h"
)


def test_cpp_sources_include_only_the_stable_abi(tmp_path):
    project = render(tmp_path, variant="cpp")
    includes = {
        f"{path.relative_to(project)}: {name}"
        for path in (project / "csrc").rglob("*")
        if path.is_file()
        for name in re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', path.read_text(), re.M)
        if name.startswith(("torch/", "ATen/", "c10/", "caffe2/", "pybind11/"))
        and not STABLE_INCLUDE.fullmatch(name)
    }
    assert not includes, "\n".join(sorted(includes))


def test_lint_clean(project):
    assert_lint_clean(project)


def test_python_files_compile(project):
    for path in project.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")


def test_pyproject_is_valid_toml(project):
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "my-torch-ops"
    assert any(dep.startswith("torch>=") for dep in meta["dependencies"])


@pytest.mark.parametrize(
    "name",
    [
        *("1abc", "my-ops", "class", "torch", "triton", "os", "my ops", "MyOps", "aten", "int", ""),
        *("true", "xor", "co_await", "test", "matplotlib"),
    ],
)
def test_hook_refuses_bad_package_name(tmp_path, capfd, name):
    with pytest.raises(FailedHookException):
        render(tmp_path, package_name=name)
    assert "package_name" in capfd.readouterr().err
    assert not any(tmp_path.iterdir()), "a refused render must leave no files"


def test_hook_names_the_answer_a_bad_package_name_came_from(tmp_path, capfd):
    with pytest.raises(FailedHookException):
        render(tmp_path, project_slug="My-Ops")
    err = capfd.readouterr().err
    assert "package_name 'My_Ops' (derived from project_slug 'My-Ops')" in err


@pytest.mark.parametrize("variant", VARIANTS)
def test_post_generation_hook_prints_the_next_commands(tmp_path, capfd, variant):
    project = render(tmp_path, variant=variant)
    out = capfd.readouterr().out
    # The README's install-and-test block, after a cd into the project.
    readme = (project / "README.md").read_text()
    (block,) = re.findall(r"^## Install and test\n.*?^```bash\n(.*?)^```", readme, re.S | re.M)
    printed = out.split("as its README says:\n\n", 1)[1]
    want = "    cd my-torch-ops\n" + "".join(f"    {line}\n" for line in block.splitlines())
    assert printed.rstrip() == want.rstrip()


@pytest.mark.parametrize(
    "key,value",
    [
        ("version", "one"),
        ("cuda_archs", "sm_90"),
        *[("python_min", v) for v in ("3", "3.9", "2.7", "4.0")],
        *[("torch_min", v) for v in ("2.10", "1.13", "3.0")],
        *[("email", v) for v in ("", "you", 'a"b@example.com', "a b@example.com")],
    ],
)
def test_hook_refuses_bad_answers(tmp_path, capfd, key, value):
    with pytest.raises(FailedHookException):
        render(tmp_path, **{key: value})
    assert key in capfd.readouterr().err
    assert not any(tmp_path.iterdir())


HOSTILE = {
    "project_name": 'Tensor "Ops" O\'Brien \\ ünïcödé 演算子 `whoami` $(touch PWNED)',
    "author": 'Zoë "Q" O\'Neil \\ `id` 😀',
    "email": "zoe+ops@example.com",
    "description": "Quotes \" ' \\ \\n, a tab\t, backticks `rm -rf /` and $(touch PWNED)",
    "package_name": "odd_ops",
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_odd_answers_render_valid_files(tmp_path, variant):
    project = render(tmp_path, variant=variant, **HOSTILE)
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["description"] == HOSTILE["description"]
    assert meta["authors"] == [{"name": HOSTILE["author"], "email": HOSTILE["email"]}]
    assert files(project) >= expected_files(variant, "odd_ops")
    assert_lint_clean(project)
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


SOURCE_SUFFIXES = {".py", ".cpp", ".cu", ".h", ".cuh", ".toml"}


def resolves(dotted: str) -> bool:
    obj = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
    return obj is not None


def test_guide_names_exist(project):
    """Every code name and path the add-an-op guide mentions exists in the rendered project."""
    guide = (project / "docs" / "adding_an_op.md").read_text()
    source = "\n".join(
        p.read_text() for p in project.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES
    )
    names = set(re.findall(r"`([A-Za-z_][\w.:/]*)`", guide))
    assert len(names) > 20

    def exists(name):
        if "my_norm" in name:  # the guide's example of a new op
            return True
        if name.startswith("torch."):  # torch API: must exist in the torch the project uses
            return resolves(name)
        if name in torch.library._OPCHECK_DEFAULT_UTILS:
            return True
        if "/" in name:
            return (project / name).exists()
        if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", source):
            return True
        return re.search(r"\.(py|cpp|cu|h|md)$", name) is not None and any(project.rglob(name))

    missing = [name for name in sorted(names) if not exists(name)]
    assert not missing, missing


def test_markdown_links_resolve(project):
    for doc in [project / "README.md", *project.glob("docs/*.md")]:
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (doc.parent / target).exists(), f"{doc.name}: dead link {target}"


# Runs the rendered setup.py up to the call of setup() and prints the libraries it would build
# (name: sources, compiler flags, limited API) and the wheel's limited-API tag.
# FAKE_CUDA makes the CPU build of torch here pass for a CUDA build, so no compiler runs.
SETUP_PROBE = """
import json, os, runpy, sys
import setuptools, torch
if os.environ.get("FAKE_CUDA"):
    torch.version.cuda = "13.0"
    torch.cuda._is_compiled = lambda: True
    torch.cuda.is_available = lambda: False
captured = {}
setuptools.setup = lambda **kwargs: captured.update(kwargs)
runpy.run_path("setup.py", run_name="__main__")
def flags(ext):
    args = ext.extra_compile_args
    return args if isinstance(args, dict) else {"cxx": args}
libraries = {
    ext.name.rpartition(".")[2]: {
        "sources": ext.sources, "args": flags(ext), "limited_api": ext.py_limited_api
    }
    for ext in captured["ext_modules"]
}
wheel_tag = captured["options"]["bdist_wheel"]["py_limited_api"]
print(json.dumps({"libraries": libraries, "wheel_tag": wheel_tag}))
"""


def fake_toolkit(tmp_path: Path) -> Path:
    """A stand-in CUDA toolkit, reached through an nvcc wrapper script (as on many systems);
    returns the folder of the wrapper."""
    toolkit, wrapper = tmp_path / "cuda-13.0", tmp_path / "wrapper"
    for folder in (toolkit / "include", toolkit / "bin", wrapper):
        folder.mkdir(parents=True)
    (toolkit / "include" / "cuda_runtime.h").touch()
    (toolkit / "bin" / "nvcc").touch(mode=0o755)
    (wrapper / "nvcc").write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    (wrapper / "nvcc").chmod(0o755)
    return wrapper


def probe_setup(project: Path, wrapper: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    base["PATH"] = f"{wrapper}{os.pathsep}{base['PATH']}"
    return subprocess.run(
        [sys.executable, "-c", SETUP_PROBE],
        cwd=project,
        env={**base, **env},
        capture_output=True,
        text=True,
    )


def built(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_cpp_build_knobs(tmp_path):
    project = render(tmp_path, variant="cpp")
    wrapper = fake_toolkit(tmp_path)
    cpu = built(probe_setup(project, wrapper))
    assert cpu["wheel_tag"] == "cp310"  # python_min's: one abi3 wheel for every later Python
    (lib,) = cpu["libraries"].values()  # _C alone
    assert lib["limited_api"] and not any(s.endswith(".cu") for s in lib["sources"])
    assert "-O3" in lib["args"]["cxx"] and "-g" not in lib["args"]["cxx"]
    # The stable ABI of the default torch_min, 2.11.
    assert "-DTORCH_TARGET_VERSION=0x020b000000000000" in lib["args"]["cxx"]
    debug = built(probe_setup(project, wrapper, DEBUG="1"))["libraries"]["_C"]["args"]["cxx"]
    assert {"-O0", "-g", "-UNDEBUG"} <= set(debug) and "-O3" not in debug

    # A CUDA build of torch: the toolkit is found behind the nvcc wrapper script on PATH, and the
    # CUDA kernels are a library of their own, _C_cuda.
    cuda = probe_setup(project, wrapper, FAKE_CUDA="1")
    assert f"CUDA_HOME={tmp_path / 'cuda-13.0'}" in cuda.stdout, cuda.stdout
    cpu_lib, cuda_lib = (built(cuda)["libraries"][name] for name in ("_C", "_C_cuda"))
    assert cpu_lib == lib
    assert cuda_lib["limited_api"]
    assert cuda_lib["sources"] == ["csrc/cuda/fused_add_rms_norm.cu", "csrc/cuda/rms_norm.cu"]
    nvcc = cuda_lib["args"]["nvcc"]
    assert {"-O3", "-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020b000000000000"} <= set(nvcc)
    nvcc = built(probe_setup(project, wrapper, FAKE_CUDA="1", DEBUG="1"))["libraries"]
    assert {"-O0", "-lineinfo"} <= set(nvcc["_C_cuda"]["args"]["nvcc"])
    assert "-G" not in nvcc["_C_cuda"]["args"]["nvcc"]
    debug2 = built(probe_setup(project, wrapper, FAKE_CUDA="1", DEBUG="2"))["libraries"]
    assert "-G" in debug2["_C_cuda"]["args"]["nvcc"]
    off = built(probe_setup(project, wrapper, FAKE_CUDA="1", USE_CUDA="0"))
    assert list(off["libraries"]) == ["_C"]

    # A CUDA build of torch and a toolkit without its headers: an error that says so, never a
    # silent CPU-only build.
    (tmp_path / "cuda-13.0" / "include" / "cuda_runtime.h").unlink()
    failed = probe_setup(project, wrapper, FAKE_CUDA="1")
    assert failed.returncode != 0 and "has no include/cuda_runtime.h" in failed.stderr


def test_cpp_build_targets_the_stable_abi_of_torch_min(tmp_path):
    """torch_min sets the stable ABI the libraries are built for, and the oldest torch they
    load into; python_min the wheel's limited-API tag."""
    project = render(tmp_path, variant="cpp", torch_min="2.12", python_min="3.12")
    result = built(probe_setup(project, fake_toolkit(tmp_path)))
    assert result["wheel_tag"] == "cp312"
    assert "-DTORCH_TARGET_VERSION=0x020c000000000000" in result["libraries"]["_C"]["args"]["cxx"]
