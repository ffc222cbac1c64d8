import pytest

from tests.tiny_models import tiny_model_dir


@pytest.fixture(scope="session")
def tiny_llama():
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="session")
def tiny_dirs():
    return {k: str(tiny_model_dir(k)) for k in ("llama", "qwen2", "opt")}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Engine tests run hundreds of tiny ops per step: one thread beats two on a shared CPU."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
