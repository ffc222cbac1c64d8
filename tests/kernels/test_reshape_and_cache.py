"""Triton reshape_and_cache against its torch twin (interpreter on CPU, compiled on GPU)."""

import pytest
import torch

from kernels import reshape_and_cache_ref
from kernels.triton_cache import reshape_and_cache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _setup(num_tokens, block_size, kv_heads, head_dim, *, num_blocks=12, dtype=torch.float32,
           cache_dtype=None, strided=False, slot_dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    cache_dtype = cache_dtype or dtype
    key_cache = torch.randn(shape, generator=g).to(cache_dtype)
    value_cache = torch.randn(shape, generator=g).to(cache_dtype)
    if strided:  # K and V as slices of a fused QKV output: token stride > row size
        fused = torch.randn(num_tokens, 3 * kv_heads, head_dim, generator=g).to(dtype)
        key, value = fused[:, kv_heads:2 * kv_heads], fused[:, 2 * kv_heads:]
    else:
        key = torch.randn(num_tokens, kv_heads, head_dim, generator=g).to(dtype)
        value = torch.randn(num_tokens, kv_heads, head_dim, generator=g).to(dtype)
    # Distinct random slots anywhere in the pool, with every 5th token padding (-1).
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[::5] = -1
    return [t.to(DEVICE) for t in (key, value, key_cache, value_cache, slots.to(slot_dtype))]


def _check(args):
    key, value, key_cache, value_cache, slots = args
    want_k, want_v = key_cache.clone().cpu(), value_cache.clone().cpu()
    reshape_and_cache_ref(key.cpu(), value.cpu(), want_k, want_v, slots.cpu().long())
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    if key.dtype != key_cache.dtype and not torch.cuda.is_available():
        # The interpreter rounds fp32 -> bf16 toward zero; GPUs (and torch) round to
        # nearest even. Allow one bf16 ulp there; compiled it must be exact.
        tol = dict(atol=0, rtol=2 ** -7)
    else:
        tol = dict(atol=0, rtol=0)  # a copy: exact
    torch.testing.assert_close(key_cache.cpu(), want_k, **tol)
    torch.testing.assert_close(value_cache.cpu(), want_v, **tol)


@pytest.mark.parametrize("block_size,kv_heads,head_dim", [(8, 3, 64), (16, 1, 128), (32, 2, 64), (16, 8, 128)])
def test_matches_reference(block_size, kv_heads, head_dim):
    _check(_setup(37, block_size, kv_heads, head_dim))


def test_casts_strided_rows_to_cache_dtype_with_int32_slots():
    _check(_setup(21, 16, 2, 64, cache_dtype=torch.bfloat16, strided=True, slot_dtype=torch.int32))


def test_empty_and_all_padding_write_nothing():
    key, value, kc, vc, slots = _setup(6, 8, 1, 64)
    before = kc.clone()
    reshape_and_cache(key, value, kc, vc, torch.full_like(slots, -1))
    reshape_and_cache(key[:0], value[:0], kc, vc, slots[:0])
    assert torch.equal(kc, before)


BAD = [
    ("key shape", lambda a: (a[0][:, :, :32], *a[1:]), ValueError, "key must have shape"),
    ("value dtype", lambda a: (a[0], a[1].half(), *a[2:]), TypeError, "value must have dtype"),
    ("value shape", lambda a: (a[0], a[1][:-1], *a[2:]), ValueError, "value must have shape"),
    ("cache dtype mix", lambda a: (*a[:3], a[3].half(), a[4]), TypeError, "value_cache must have dtype"),
    ("cache layout", lambda a: (a[0], a[1], a[2].transpose(2, 3).contiguous().transpose(2, 3), *a[3:]),
     ValueError, "contiguous"),
    ("slots len", lambda a: (*a[:4], a[4][:-1]), ValueError, "slot_mapping must have shape"),
    ("slots float", lambda a: (*a[:4], a[4].float()), TypeError, "slot_mapping must have dtype"),
    ("not a tensor", lambda a: (a[0].tolist(), *a[1:]), TypeError, "key must be a torch.Tensor"),
]


@pytest.mark.parametrize("mutate,exc,match", [pytest.param(m, e, s, id=i) for i, m, e, s in BAD])
def test_wrapper_rejects_bad_inputs(mutate, exc, match):
    with pytest.raises(exc, match=match):
        reshape_and_cache(*mutate(_setup(5, 8, 2, 64)))
