"""Model tests run torch single-threaded.

Their forwards are hundreds of tiny ops; on a small shared CPU, intra-op threads
cost far more in handoffs than they save (measured ~5x slower with 2 threads here).
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
