"""Developer commands: the one list that CI and the README call.

    nox -s lint           ruff check and ruff format --check{% if cookiecutter.variant == "cpp" %}, clang-format on csrc/{% endif %}
    nox -s format         format the code as lint wants it (same tools, same versions)
    nox -s tests          install with the documented command into a fresh env, run pytest
    nox -s benchmark      the benchmark (options after --)
    nox -s build          sdist and wheel into dist/ (options after --, e.g. -- --sdist)
    nox -s wheel          the wheel into dist/, checked, installed, imported outside the source
{%- if cookiecutter.variant == "cpp" %}
    nox -s cuda_build     build the CUDA kernels (no GPU needed) and check they are registered
{%- endif %}

Which torch the sessions install: TORCH_SPEC (default "torch") from TORCH_INDEX_URL (default
PyTorch's CPU wheel index{% if cookiecutter.variant == "cpp" %}, its CUDA 13.0 one for cuda_build{% endif %}; set it empty to use your pip
configuration).
"""

import os
import re
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
{%- if cookiecutter.variant == "cpp" %}
CUDA_INDEX = "https://download.pytorch.org/whl/cu130"
BUILD_DEPS = ["setuptools>=77", "wheel", "ninja", "numpy"]  # torch warns at import without numpy
WHEEL_TAG = "cp{{ cookiecutter.python_min | replace('.', '') }}-abi3"  # one wheel for every Python from {{ cookiecutter.python_min }} on
{%- else %}
BUILD_DEPS = ["setuptools>=77", "wheel"]
{%- endif %}


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
    session.run("pytest", *session.posargs)


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
    """The wheel into dist/: its tag checked, installed, imported outside the source tree."""
    install_torch(session, CPU_INDEX)
    session.install(*BUILD_DEPS, "build")
    tmp = Path(session.create_tmp())
    out = tmp / "dist"
    shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out))
    (built,) = out.glob("*.whl")
    # name-version-python-abi-platform.whl
    tag = "-".join(built.stem.split("-")[-3:-1])
{%- if cookiecutter.variant == "cpp" %}
    if tag != WHEEL_TAG:
        session.error(f"{built.name}: tagged {tag}, not {WHEEL_TAG}")
    session.install("abi3audit", "auditwheel")
    session.run("abi3audit", "--strict", "--report", str(built))
    # For information only: the libraries link torch's, which a wheel must not bundle, so
    # the wheel is not repaired into a manylinux one.
    session.run("auditwheel", "show", str(built))
{%- else %}
    if tag != "py3-none":
        session.error(f"{built.name}: tagged {tag}, not py3-none (pure Python)")
{%- endif %}
    Path("dist").mkdir(exist_ok=True)
    wheel_path = shutil.copy(built, "dist")
    session.install(wheel_path)
    session.chdir(tmp)  # not the project root, whose src/ must not be what is imported
    session.run("python", "-c", CHECK_INSTALLED)


CHECK_INSTALLED = """
from pathlib import Path
import {{ cookiecutter.package_name }}
where = Path({{ cookiecutter.package_name }}.__file__)
assert "site-packages" in where.parts, f"imported {where}, not the installed wheel"
print("imported the installed wheel:", where.parent)
"""
{%- if cookiecutter.variant == "cpp" %}


@nox.session
def cuda_build(session: nox.Session) -> None:
    """Compiles the CUDA kernels with no GPU needed and checks that every op has a CUDA kernel."""
    install_torch(session, CUDA_INDEX)
    # A kernel that spills registers to local memory fails the build instead of running slowly.
    session.env["NVCC_APPEND_FLAGS"] = " ".join(
        [os.environ.get("NVCC_APPEND_FLAGS", ""), STRICT_PTXAS]
    ).strip()
    install_project(session)
    session.run("pytest", "tests/test_extension.py", "-k", "every_op_has_its_kernels")
    session.run("python", "-c", CHECK_CUDA_BUILT)


STRICT_PTXAS = "-Xptxas=--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error"
CHECK_CUDA_BUILT = """
import {{ cookiecutter.package_name }}
assert {{ cookiecutter.package_name }}.cuda_built(), "built without CUDA kernels"
print("CUDA kernels registered for every op")
"""
{%- endif %}
