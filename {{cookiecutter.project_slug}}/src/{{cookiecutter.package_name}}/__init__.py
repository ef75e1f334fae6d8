"""Custom PyTorch operators that compose with torch.compile: RMSNorm and a fused residual-add
RMSNorm, forward and backward. Each op is a module of its own; a new op is one more import here."""

import torch
{% if cookiecutter.variant == 'cpp' %}
from ._extension import cuda_built  # first: loads the compiled ops
{%- endif %}
from .fused_add_rms_norm import fused_add_rms_norm, fused_add_rms_norm_
from .nn import RMSNorm, replace_rms_norm
from .rms_norm import rms_norm

if torch.distributed.is_available():  # torch builds without it have no DTensor
    from . import sharding  # registers how the ops run on DTensors
