"""Property test: random varlen batches through paged_attention match the torch twin."""

import pytest

from tests.kernels.paged_batch import make_batch
from tests.kernels.test_paged_attention import _check, _to


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@hypothesis.settings(max_examples=8, deadline=None, derandomize=True)
@hypothesis.given(
    specs=st.lists(st.tuples(st.sampled_from([0, 1, 1, 2, 9, 40]), st.integers(0, 150)), min_size=1, max_size=5),
    config=st.sampled_from([(8, 64, 1, 3), (16, 128, 2, 1), (32, 64, 1, 4)]),
)
def test_random_varlen_batches(specs, config):
    """Random mixes of empty, decode, short and long chunks over random prefixes."""
    block_size, head_dim, kv_heads, group = config
    specs = [(q, q + prefix) for q, prefix in specs if q + prefix > 0]
    hypothesis.assume(sum(q for q, _ in specs) > 0)
    _check(_to(make_batch(specs, block_size=block_size, kv_heads=kv_heads, group=group, head_dim=head_dim)))
