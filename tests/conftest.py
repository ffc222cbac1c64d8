"""Suite-wide setup.

Triton kernels run in Triton's interpreter on torch CPU tensors when no CUDA
device is present. The variable must be set before triton is first imported,
so it is set here, at collection start.
"""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("KVSCOPE_FORCE_COMPILED_TRITON") != "1":
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    except ImportError:  # the no-torch core tests run in subprocesses anyway
        os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cpu_kernels():
    """The reduced-precision CPU kernels (kernels/cpu_linear.cpp), built on first use.
    Skipped only where no C++ compiler is installed; any other build failure fails."""
    from kernels import cpu_linear

    reason = cpu_linear.missing_compiler()
    if reason is not None:
        pytest.skip(reason)
    return cpu_linear.extension()
