"""The RMSNorm module: a drop-in for torch.nn.RMSNorm (state_dict, eps, no graph breaks)."""

import numpy as np
import pytest
import torch

from {{ cookiecutter.package_name }} import RMSNorm


def test_module_has_no_graph_breaks(device):
    # eps=None resolves to a machine epsilon inside forward: a constant to torch.compile.
    norm = RMSNorm(64, device=device)
    explanation = torch._dynamo.explain(norm)(torch.randn(6, 64, device=device))
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_module_matches_torch_rmsnorm(device):
    ours = RMSNorm(64, eps=1e-6, device=device)
    theirs = torch.nn.RMSNorm(64, eps=1e-6, device=device)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(3, 5, 64, device=device)
    torch.testing.assert_close(ours(x), theirs(x))
    no_affine = RMSNorm(64, elementwise_affine=False)
    assert no_affine.weight is None and not no_affine.state_dict()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_module_default_eps_matches_torch_rmsnorm(device, dtype):
    # eps=None is a machine epsilon, as in torch.nn.RMSNorm: rows this small show which one.
    x = 1e-2 * torch.randn(3, 64, device=device, dtype=dtype)
    ours = RMSNorm(64, device=device, dtype=dtype)
    theirs = torch.nn.RMSNorm(64, device=device, dtype=dtype)
    assert ours.eps is None and theirs.eps is None
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("affine", [True, False], ids=["weight", "no_weight"])
def test_module_checks_the_normalized_dimension(affine):
    norm = RMSNorm(np.int64(16), elementwise_affine=affine)  # numpy's int, as torch.nn takes it
    assert norm.normalized_shape == (16,)
    with pytest.raises(ValueError, match=r"a last dimension of 16 \(normalized_shape\)"):
        norm(torch.randn(2, 8))
    with pytest.raises(ValueError, match="normalized_shape must be an int"):
        RMSNorm((4, 16))
