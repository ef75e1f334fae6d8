"""torch.export and AOTInductor: a model that uses the ops exports with a dynamic batch size and
keeps the ops in its graph; AOTInductor compiles it into a package that a fresh Python process
runs{% if cookiecutter.variant == 'cpp' %} once the compiled libraries are loaded{% else %} without importing the project{% endif %}.
"""

import subprocess
import sys

import pytest
import torch

from {{ cookiecutter.package_name }} import RMSNorm, {% if cookiecutter.variant == 'cpp' %}_extension, {% endif %}fused_add_rms_norm, rms_norm

OPS = torch.ops.{{ cookiecutter.package_name }}
HIDDEN = 64
BATCH_DIM = {0: torch.export.Dim("batch")}  # dimension 0 of an input: the batch, of any size
DYNAMIC_SHAPES = {"x": BATCH_DIM, "residual": BATCH_DIM}

{% if cookiecutter.variant == 'cpp' -%}
# Run by a fresh Python after load_ops (lines that register the ops, or none): loads the
# AOTInductor package (argv[1]) and checks it against the inputs and eager outputs that the test
# saved (argv[2]).
{%- else -%}
# Run by a fresh Python: loads the AOTInductor package (argv[1]) and checks it against the inputs
# and eager outputs that the test saved (argv[2]).
{%- endif %}
RUN_PACKAGE = """
import sys

import torch
{% if cookiecutter.variant == 'cpp' %}{load_ops}
{% endif %}package = torch._inductor.aoti_load_package(sys.argv[1])
inputs, expected = torch.load(sys.argv[2])
torch.testing.assert_close(package(*inputs), expected)
assert {project!r} not in sys.modules, "the package needs no Python code of the project"
"""


class Block(torch.nn.Module):
    """The norms of a transformer block's residual stream, through the three public entry points."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.norm = RMSNorm(hidden)

    def forward(self, x, residual):
        y, h = fused_add_rms_norm(x, residual, self.weight)
        return self.norm(y) + rms_norm(h), h


def make_inputs(batch, device):
    return torch.randn(batch, HIDDEN, device=device), torch.randn(batch, HIDDEN, device=device)


def export(device):
    """The block and its export for inference. Without a gradient to record, the graph calls the
    ops that compute no rstd; decomposing it to core ATen leaves them in as they are."""
    block = Block(HIDDEN).to(device)
    with torch.no_grad():
        ep = torch.export.export(block, make_inputs(4, device), dynamic_shapes=DYNAMIC_SHAPES)
    return block, ep.run_decompositions()


def eager(block, inputs):
    with torch.no_grad():
        return block(*inputs)


def test_export_keeps_the_ops(device, tmp_path):
    """The exported program calls the ops, runs at batch sizes other than the example's (1 too: no
    specialization), and saves and loads."""
    block, ep = export(device)
    project_ops = {
        node.target
        for node in ep.graph.nodes
        if getattr(node.target, "namespace", None) == OPS.name
    }
    assert project_ops == {OPS.rms_norm.default, OPS.fused_add_rms_norm.default}
    torch.export.save(ep, tmp_path / "block.pt2")
    loaded = torch.export.load(tmp_path / "block.pt2")
    for batch in (4, 1, 7):
        inputs = make_inputs(batch, device)
        expected = eager(block, inputs)
        torch.testing.assert_close(ep.module()(*inputs), expected)
        torch.testing.assert_close(loaded.module()(*inputs), expected)


# With torch 2.11, aoti_load_package crashed (a segfault) on any package, plain torch ops too.
needs_loadable_packages = pytest.mark.skipif(
    torch.__version__ < "2.13",
    reason="AOTInductor packages crashed on load with torch 2.11; they load with 2.13 and later",
)


def compile_package(device, tmp_path):
    """Compiles the exported block with AOTInductor; returns the package's path and that of a
    file with inputs of another batch size and the block's eager outputs for them."""
    block, ep = export(device)
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "block.pt2"))
    inputs = make_inputs(7, device)
    data = tmp_path / "inputs_and_outputs.pt"
    torch.save((inputs, eager(block, inputs)), data)
    return package, data


def run_package(package, data{% if cookiecutter.variant == 'cpp' %}, load_ops=""{% endif %}):
    code = RUN_PACKAGE.format({% if cookiecutter.variant == 'cpp' %}load_ops=load_ops, {% endif %}project=OPS.name)
    return subprocess.run(
        [sys.executable, "-c", code, package, data], capture_output=True, text=True
    )
{% if cookiecutter.variant == 'cpp' %}

@needs_loadable_packages
def test_aoti_package_needs_the_compiled_library(device, tmp_path):
    """The package calls the ops by name: a process runs it once the built libraries have
    registered them, loaded as here (no Python code of the project needed) or by importing the
    project. Without them, loading the package fails with an error that names the missing op."""
    package, data = compile_package(device, tmp_path)
    result = run_package(package, data)
    assert result.returncode != 0
    assert f"Could not find schema for {OPS.name}::" in result.stderr, result.stderr
    load_ops = "".join(f"torch.ops.load_library({path!r})\n" for path in _extension.LIBRARIES)
    result = run_package(package, data, load_ops=load_ops)
    assert result.returncode == 0, result.stderr
{%- else %}

@needs_loadable_packages
def test_aoti_package_runs_without_the_project(device, tmp_path):
    """Inductor compiles the ops' bodies into the package (on CUDA their Triton kernels, on CPU
    their pure-PyTorch path): a process that never imports the project runs it."""
    package, data = compile_package(device, tmp_path)
    result = run_package(package, data)
    assert result.returncode == 0, result.stderr
{%- endif %}
