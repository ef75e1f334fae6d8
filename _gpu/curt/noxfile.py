"""Developer commands: the one list that CI, the README and the template's tests all call.

    nox -s lint           ruff check and ruff format --check
    nox -s tests          install with the documented command into a fresh env, run pytest
    nox -s benchmark      the benchmark (options after --)
    nox -s build          sdist and wheel into dist/

Which torch the sessions install: TORCH_SPEC (default "torch") from TORCH_INDEX_URL (default
PyTorch's CPU wheel index; set it empty to use your pip configuration).
"""

import os
import re
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
BUILD_DEPS = ["setuptools>=77", "wheel"]


def install_torch(session: nox.Session, default_index: str) -> None:
    spec = os.environ.get("TORCH_SPEC", "torch")
    index = os.environ.get("TORCH_INDEX_URL", default_index)
    session.install(spec, *(["--index-url", index] if index else []))


def install_project(session: nox.Session) -> None:
    # The documented command; the build uses the torch already in the environment.
    session.install(*BUILD_DEPS)
    session.install("--no-build-isolation", "-e", ".[test]")


def pinned(session: nox.Session, repo: str) -> str:
    """The version .pre-commit-config.yaml pins for a hook repository: pre-commit and lint agree."""
    config = Path(".pre-commit-config.yaml").read_text()
    match = re.search(rf"/{repo}\n\s+rev: v(\S+)", config)
    if not match:
        session.error(f"no 'rev: v...' for {repo} in .pre-commit-config.yaml")
    return match.group(1)


@nox.session
def lint(session: nox.Session) -> None:
    session.install(f"ruff=={pinned(session, 'ruff-pre-commit')}")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


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
    session.install(*BUILD_DEPS, "build")
    session.run("python", "-m", "build", "--no-isolation", "--outdir", "dist")
