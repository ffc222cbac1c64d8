"""Suite-wide setup.

Triton kernels run in Triton's interpreter on torch CPU tensors when no CUDA
device is present. The variable must be set before triton is first imported,
so it is set here, at collection start.
"""

import os

from engine import envs

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not envs.FORCE_COMPILED_TRITON.get():
    try:
        import torch

        if not torch.cuda.is_available():
            envs.TRITON_INTERPRET.set_default("1")
    except ImportError:  # the no-torch core tests run in subprocesses anyway
        envs.TRITON_INTERPRET.set_default("1")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cpu_compiler():
    """For tests of the C++ CPU kernels (kernels/*.cpp, built on first use): skipped only
    where no C++ compiler is installed; any other build failure fails the test."""
    from kernels.cpu_build import missing_compiler

    reason = missing_compiler()
    if reason is not None:
        pytest.skip(reason)
