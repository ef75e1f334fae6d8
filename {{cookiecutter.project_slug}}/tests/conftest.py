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

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
CUDA_SKIPPED = pytest.StashKey[int]()


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a GPU; skipped, with the reason, without one")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA is not available")
    skipped = [item for item in items if item.get_closest_marker("cuda")]
    for item in skipped:
        item.add_marker(skip)
    config.stash[CUDA_SKIPPED] = len(skipped)


def pytest_terminal_summary(terminalreporter, config):
    # One line for the whole CUDA half of the suite, instead of a line per test.
    if config.stash.get(CUDA_SKIPPED, 0):
        terminalreporter.write_line(
            f"{config.stash[CUDA_SKIPPED]} tests skipped: they need a GPU and CUDA is not available"
        )


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=[*DEVICES, "meta"])
def checked_device(request):
    """For tests of bad input: a call on meta tensors is checked where torch.compile checks it (the
    fake impls, in Python), and must fail as a CPU or CUDA call does."""
    return request.param


{%- if cookiecutter.variant == "triton" %}


@pytest.fixture
def kernel_device():
    """Where tests that call the Triton kernels directly run them: the GPU, or without one the CPU
    through the interpreter (the ops themselves send CPU tensors to the reference)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
{%- endif %}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
