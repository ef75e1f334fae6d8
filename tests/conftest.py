from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]
VARIANTS = ["triton", "cpp"]


def render(output_dir: Path, **answers: str) -> Path:
    """Renders the template non-interactively and returns the project directory."""
    return Path(
        cookiecutter(
            str(TEMPLATE), no_input=True, output_dir=str(output_dir), extra_context=answers
        )
    )


@pytest.fixture(scope="session", params=VARIANTS)
def variant(request):
    return request.param


@pytest.fixture(scope="session")
def project(variant, tmp_path_factory):
    """A project rendered with the default answers."""
    return render(tmp_path_factory.mktemp(variant), variant=variant)
