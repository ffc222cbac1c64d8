import pytest

from tests.tiny_models import tiny_model_dir


@pytest.fixture(scope="session")
def tiny_llama():
    return str(tiny_model_dir("llama"))
