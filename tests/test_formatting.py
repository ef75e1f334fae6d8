"""The rendered projects already pass their own pre-commit hooks: what `nox -s lint` runs (ruff,
and clang-format for cpp) and the YAML, end-of-file and trailing-whitespace checks, with no file
changed. pre-commit itself needs the hooks' repositories from GitHub, so the tools run directly."""

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import nox
import pytest
import yaml

from conftest import TEMPLATE, render

BIN = Path(sys.executable).parent
# The package name's length moves line breaks: in the Python, and in the C++ (its namespace).
NAMES = ["ops", "my_ops", "a_rather_long_package_name_for_kernels"]
RENDERS = [(variant, name) for variant in ("triton", "cpp") for name in NAMES]
COMMON_HOOKS = {
    "check-yaml",
    "end-of-file-fixer",
    "trailing-whitespace",
    "ruff-check",
    "ruff-format",
}
HOOKS = {"triton": COMMON_HOOKS, "cpp": COMMON_HOOKS | {"clang-format"}}


@pytest.fixture(scope="module", params=RENDERS, ids="-".join)
def rendered(request, tmp_path_factory):
    variant, name = request.param
    return variant, render(tmp_path_factory.mktemp(variant), variant=variant, package_name=name)


def pre_commit_revs(project: Path) -> dict[str, str]:
    """Hook repository name -> its pinned version, without the leading v."""
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    return {r["repo"].rsplit("/", 1)[1]: r["rev"].removeprefix("v") for r in config["repos"]}


class RecordingSession:
    """Stands in for a nox session: records what a session installs and runs."""

    def __init__(self):
        self.installed, self.commands = [], []

    def install(self, *args):
        self.installed += args

    def run(self, *args):
        self.commands.append(list(args))

    def error(self, message):
        raise AssertionError(message)


def lint_session(project: Path, monkeypatch) -> RecordingSession:
    monkeypatch.chdir(project)  # the noxfile reads .pre-commit-config.yaml from the project root
    # The plain functions, kept out of nox's registry (a session registered twice is an error).
    monkeypatch.setattr(nox, "session", lambda func=None, **_: func or (lambda f: f))
    session = RecordingSession()
    runpy.run_path("noxfile.py")["lint"](session)
    return session


def test_lint_session_installs_the_pinned_versions_and_passes(rendered, monkeypatch):
    variant, project = rendered
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    assert {hook["id"] for repo in config["repos"] for hook in repo["hooks"]} == HOOKS[variant]
    revs = pre_commit_revs(project)
    session = lint_session(project, monkeypatch)
    expected = [f"ruff=={revs['ruff-pre-commit']}"]
    if variant == "cpp":
        expected.append(f"clang-format=={revs['mirrors-clang-format']}")
        (clang_format,) = [cmd for cmd in session.commands if cmd[0] == "clang-format"]
        csrc = [p for p in (project / "csrc").rglob("*") if p.is_file()]
        sources = {str(p.relative_to(project)) for p in csrc}
        assert set(clang_format) >= sources, "nox -s lint leaves C++ files unchecked"
        assert (project / ".clang-format").is_file()
    assert session.installed == expected

    # What the session runs, with this environment's tools: nothing to change.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RUFF_NO_CACHE": "true"}
    for cmd in session.commands:
        result = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout}{result.stderr}"


def test_files_end_with_one_newline_and_no_trailing_whitespace(rendered):
    _, project = rendered
    for path in (p for p in project.rglob("*") if p.is_file()):
        text, name = path.read_text(), path.relative_to(project)
        assert not text or (text.endswith("\n") and not text.endswith("\n\n")), name
        lines = [i for i, line in enumerate(text.splitlines(), 1) if line != line.rstrip()]
        assert not lines, f"{name}: trailing whitespace on lines {lines}"


def test_yaml_files_parse(rendered):
    _, project = rendered
    yaml_files = [p for p in project.rglob("*") if p.suffix in (".yml", ".yaml")]
    assert len(yaml_files) >= 4
    for path in yaml_files:
        yaml.safe_load(path.read_text())


def test_template_tests_use_the_pinned_clang_format(tmp_path):
    """This suite checks the C++ with the clang-format version the rendered hooks pin."""
    pinned = pre_commit_revs(render(tmp_path, variant="cpp"))["mirrors-clang-format"]
    requirements = (TEMPLATE / "requirements-test.txt").read_text()
    assert re.findall(r"^clang-format==(\S+)$", requirements, re.M) == [pinned]
    version = subprocess.run(
        [BIN / "clang-format", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"version {pinned}" in version, version
