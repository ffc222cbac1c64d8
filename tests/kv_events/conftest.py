# The engine tests' tiny model and one-torch-thread fixtures, shared rather than copied.
from tests.engine.conftest import _one_torch_thread, tiny_llama  # noqa: F401
