"""cruft: create a project, check it, and update it after the template changes.

Through cruft's Python API (what its CLI calls), in this process: a CLI run spends most of its
second importing."""

import json
import shutil
import subprocess
from pathlib import Path

import cruft
import pytest
from cookiecutter.exceptions import FailedHookException

from conftest import TEMPLATE, VARIANTS, render

SLUG = "{{cookiecutter.project_slug}}"
ANSWERS = {"package_name": "my_ops"}
# Template changes the update has to bring in: new lines in files of both variants, a new file
# (in a new folder) of the cpp variant only, and a cpp-only file removed.
NEW_IGNORE = "*.cruft-test"
NEW_README = "A line the template added after the project was made."
CPP_ONLY_NEW = "extra/{% if cookiecutter.variant == 'cpp' %}cpp_only.txt{% endif %}"
CPP_ONLY_GONE = "{% if cookiecutter.variant == 'cpp' %}MANIFEST.in{% endif %}"
USER_EDIT = "# The project's own edit, which the update must keep."


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Git and cookiecutter with an empty home: no user config, commits under a fixed name."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("COOKIECUTTER_CONFIG", raising=False)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.com")


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    assert result.returncode == 0, f"git {args}: {result.stdout}\n{result.stderr}"
    return result.stdout


def commit(repo: Path, message: str):
    if not (repo / ".git").exists():
        git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".git" not in p.parts
    }


@pytest.fixture
def template(tmp_path) -> Path:
    """The template's working tree (what cookiecutter reads), committed to a fresh git repo."""
    repo = tmp_path / "template"
    repo.mkdir()
    shutil.copy2(TEMPLATE / "cookiecutter.json", repo)
    extensions = json.loads((TEMPLATE / "cookiecutter.json").read_text()).get("_extensions", [])
    for module in {e.split(".")[0] for e in extensions}:
        shutil.copy2(TEMPLATE / f"{module}.py", repo)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".nox", ".ruff_cache", ".venv")
    for folder in ("hooks", SLUG):
        shutil.copytree(TEMPLATE / folder, repo / folder, ignore=ignore)
    commit(repo, "template")
    return repo


def change_template(template: Path):
    project = template / SLUG
    with open(project / ".gitignore", "a") as f:
        f.write(f"\n{NEW_IGNORE}\n")
    with open(project / "README.md", "a") as f:
        f.write(f"\n{NEW_README}\n")
    (project / CPP_ONLY_NEW).parent.mkdir()
    (project / CPP_ONLY_NEW).write_text("cpp only\n")
    (project / CPP_ONLY_GONE).unlink()
    commit(template, "change the template")


@pytest.mark.parametrize("variant", VARIANTS)
def test_create_check_update(variant, template, tmp_path, capsys):
    answers = {**ANSWERS, "variant": variant}
    project = cruft.create(
        str(template), output_dir=tmp_path / "out", extra_context=answers, no_input=True
    )
    state = json.loads((project / ".cruft.json").read_text())
    assert state["commit"] == head(template)
    assert state["context"]["cookiecutter"]["variant"] == variant
    # The same files as plain cookiecutter renders, plus cruft's record.
    plain = render(tmp_path / "plain", **answers)
    assert files(project) == files(plain) | {".cruft.json"}

    commit(project, "rendered")
    assert cruft.check(project)
    # Rendering the template again gives the project's files unchanged.
    assert cruft.diff(project, exit_code=True)

    with open(project / "noxfile.py", "a") as f:
        f.write(f"{USER_EDIT}\n")
    commit(project, "own edit")
    change_template(template)

    capsys.readouterr()
    assert not cruft.check(project)
    assert "out of date" in capsys.readouterr().out
    assert cruft.update(project, skip_apply_ask=True)

    assert NEW_IGNORE in (project / ".gitignore").read_text().splitlines()
    assert NEW_README in (project / "README.md").read_text()
    assert (project / "noxfile.py").read_text().endswith(f"{USER_EDIT}\n")
    assert (project / "extra" / "cpp_only.txt").exists() == (variant == "cpp")
    assert (project / "extra").exists() == (variant == "cpp")
    assert not (project / "MANIFEST.in").exists()
    assert not [p for p in files(project) if p.endswith((".rej", ".orig"))]
    status = git(project, "status", "--porcelain").splitlines()
    assert not [line for line in status if "U" in line[:2]], status
    assert json.loads((project / ".cruft.json").read_text())["commit"] == head(template)

    commit(project, "cruft update")
    assert cruft.check(project)
    # The project now differs from the template only by its own edit.
    capsys.readouterr()
    cruft.diff(project, exit_code=True)
    diff = capsys.readouterr().out.splitlines()
    changed = [x for x in diff if x.startswith(("+", "-")) and not x.startswith(("+++", "---"))]
    assert changed == [f"-{USER_EDIT}"], diff


def test_link_cookiecutter_project(template, tmp_path):
    """A project made with plain cookiecutter joins in with `cruft link`."""
    answers = {**ANSWERS, "variant": "cpp"}
    project = render(tmp_path, **answers)
    commit(project, "rendered")
    assert cruft.link(str(template), project_dir=project, extra_context=answers, no_input=True)
    state = json.loads((project / ".cruft.json").read_text())
    assert state["commit"] == head(template)
    assert state["context"]["cookiecutter"]["package_name"] == "my_ops"
    commit(project, "cruft link")
    assert cruft.check(project)
    assert cruft.diff(project, exit_code=True)


def test_create_refuses_bad_answer(template, tmp_path, capfd):
    """The pre-generation hook runs under cruft too."""
    with pytest.raises(FailedHookException):
        cruft.create(
            str(template),
            output_dir=tmp_path / "out",
            extra_context={"package_name": "torch"},
            no_input=True,
        )
    assert "package_name 'torch'" in capfd.readouterr().err
    assert not (tmp_path / "out" / "my-torch-ops").exists()
