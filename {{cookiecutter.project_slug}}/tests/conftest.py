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
NO_CUDA = "CUDA is not available"


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a GPU; skipped, with the reason, without one")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))


def pytest_terminal_summary(terminalreporter):
    # One line for the whole CUDA half of the suite, instead of a line per test. Counted from the
    # test reports, which reach this process also when pytest-xdist's workers ran the tests.
    skipped = terminalreporter.stats.get("skipped", [])
    count = sum(NO_CUDA in str(report.longrepr) for report in skipped)
    if count:
        terminalreporter.write_line(f"{count} tests skipped: they need a GPU and {NO_CUDA}")


def pytest_generate_tests(metafunc):
    # The op test classes of op_tests.py: a test per dtype the op's class lists.
    dtypes = getattr(metafunc.cls, "dtypes", None)
    if dtypes is not None and "dtype" in metafunc.fixturenames:
        metafunc.parametrize("dtype", dtypes, ids=str)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=[*DEVICES, "meta"])
def checked_device(request):
    """For tests of bad input: a call on meta tensors is checked where torch.compile checks it (the
    fake impls, in Python), and must fail as a CPU or CUDA call does."""
    return request.param


def ops_error(device: str, error: type[Exception]) -> type[Exception]:
    """What a bad call straight to torch.ops raises on device where the public function raises
    error{% if cookiecutter.variant == "cpp" %}: RuntimeError, with the same message, from the C++ kernels' checks (the LibTorch stable
    ABI raises no other); error on meta tensors, whose fake impls run the Python checks."""
    return error if device == "meta" else RuntimeError{% else %}: the same, as the ops run the Python checks."""
    return error{% endif %}


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
