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
