import os

import pytest
import torch

# Without a GPU, run the Triton kernels themselves on CPU tensors through Triton's interpreter
# (read when Triton is first imported, so it is set here, before the package is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a GPU; skipped, with the reason, without one")


def pytest_collection_modifyitems(items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA is not available")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=[*DEVICES, "meta"])
def checked_device(request):
    """For tests of bad input: a call on meta tensors is checked where torch.compile checks it (the
    fake impls, in Python), and must fail as a CPU or CUDA call does."""
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def compile_backend(device):
    """torch.compile's backend for a test on ``device``: inductor, except on CPU, where it cannot
    compile around a Triton kernel; aot_eager still traces both passes into graphs of the ops."""
    return "aot_eager" if device == "cpu" else "inductor"
