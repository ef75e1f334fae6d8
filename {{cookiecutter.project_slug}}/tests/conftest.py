{% if cookiecutter.variant == "triton" -%}
import os

{% endif -%}
import pytest
import torch
{%- if cookiecutter.variant == "triton" %}

# Without a GPU, run the Triton kernels themselves on CPU tensors through Triton's interpreter
# (read when Triton is first imported, so it is set here, before the package is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
{%- endif %}

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
    ),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
