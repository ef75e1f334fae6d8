"""The GitHub workflows, rendered and the template's own: valid against GitHub's schema, actionlint
(with shellcheck on the run: scripts) finds nothing, and zizmor (offline) nothing of medium
severity or above."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEMPLATE, VARIANTS, render

BIN = Path(sys.executable).parent


def check(*cmd):
    # This environment's tools first on PATH: actionlint runs the shellcheck installed beside it.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def assert_workflows_clean(root: Path) -> None:
    github = root / ".github"
    workflows = sorted((github / "workflows").glob("*.yml"))
    assert workflows
    schema = [BIN / "check-jsonschema", "--builtin-schema"]
    check(*schema, "vendor.github-workflows", *workflows)
    check(*schema, "vendor.dependabot", github / "dependabot.yml")
    # The project's settings (a self-hosted runner's label), found here also outside a git repo.
    config = github / "actionlint.yaml"
    check(
        BIN / "actionlint",
        "-oneline",
        *(["-config-file", config] if config.exists() else []),
        *workflows,
    )
    check(BIN / "zizmor", "--offline", "--min-severity", "medium", root)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("gpu_runner", ["", "gpu-h100"])
def test_rendered_workflows(tmp_path, variant, gpu_runner):
    project = render(tmp_path, variant=variant, gpu_runner=gpu_runner)
    assert_workflows_clean(project)
    ci = (project / ".github" / "workflows" / "ci.yml").read_text()
    assert ("cuda_build" in ci) == (variant == "cpp")
    assert ("self-hosted" in ci) == bool(gpu_runner)
    release = (project / ".github" / "workflows" / "release.yml").read_text()
    assert 'tags: ["v*"]' in release
    assert "nox -s wheel" in release
    # Trusted publishing: the OIDC token on the publish job only, no PyPI token anywhere.
    assert release.count("id-token: write") == 1 and "environment: pypi" in release
    assert "password" not in release and "secrets." not in release
    # Each wheel tested with the oldest supported torch and the newest.
    assert 'torch: ["2.11", newest]' in release
    # cpp: a CPU wheel and a CUDA one, built where the manylinux tag holds.
    assert ("flavor: [cpu, cu130]" in release) == (variant == "cpp")
    assert ("container: quay.io/pypa/manylinux_2_28_x86_64" in release) == (variant == "cpp")


def test_template_workflows():
    assert_workflows_clean(TEMPLATE)
