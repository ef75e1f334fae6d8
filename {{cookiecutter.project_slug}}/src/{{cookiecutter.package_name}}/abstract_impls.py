"""Fake ("abstract") impls: output shapes and dtypes without running a kernel.

torch.compile, torch.export and meta tensors call these instead of the kernels.
"""

from __future__ import annotations

import torch

from ._checks import check_bwd_inputs, check_inputs
from .reference import compute_dtype


@torch.library.register_fake("{{ cookiecutter.package_name }}::rms_norm_fwd")
def _rms_norm_fwd_fake(x, weight, eps):
    check_inputs(x, weight)
    y = x.new_empty(x.shape)
    rstd = x.new_empty(x.shape[:-1], dtype=compute_dtype(x))
    return y, rstd


@torch.library.register_fake("{{ cookiecutter.package_name }}::rms_norm_bwd")
def _rms_norm_bwd_fake(grad_y, x, rstd, weight):
    check_bwd_inputs(grad_y, x, rstd, weight)
    dx = x.new_empty(x.shape)
    # Without a weight there is no weight gradient: an empty placeholder keeps the schema fixed.
    dw = x.new_empty(0, dtype=torch.float32) if weight is None else weight.new_empty(weight.shape)
    return dx, dw
