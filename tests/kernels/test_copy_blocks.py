"""Triton copy_blocks (copy-on-write) against its torch twin, across layers."""

import pytest
import torch

from kernels import copy_blocks_ref
from kernels.triton_copy import copy_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _caches(num_layers=3, shape=(10, 16, 2, 64), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = [torch.randn(shape, generator=g).to(dtype).to(DEVICE) for _ in range(num_layers)]
    v = [torch.randn(shape, generator=g).to(dtype).to(DEVICE) for _ in range(num_layers)]
    return k, v


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (10, 16, 2, 64)), (torch.bfloat16, (10, 8, 3, 128)),
                                         (torch.float16, (10, 32, 1, 64))])
@pytest.mark.parametrize("mapping_device", sorted({"cpu", DEVICE}))
def test_matches_reference(dtype, shape, mapping_device):
    k, v = _caches(shape=shape, dtype=dtype)
    want_k, want_v = [t.clone() for t in k], [t.clone() for t in v]
    mapping = torch.tensor([[2, 7], [2, 9], [0, 4]], dtype=torch.int64)
    copy_blocks_ref(want_k, want_v, mapping.to(DEVICE))
    copy_blocks(k, v, mapping.to(mapping_device))
    for got, want in zip(k + v, want_k + want_v):
        assert torch.equal(got, want)


def test_empty_mapping_is_a_no_op():
    k, v = _caches()
    before = [t.clone() for t in k]
    copy_blocks(k, v, torch.empty(0, 2, dtype=torch.int64))
    assert all(torch.equal(a, b) for a, b in zip(k, before))


def _bad_mapping(rows):
    return lambda k, v, m: (k, v, torch.tensor(rows, dtype=torch.int64))


BAD = [
    ("mapping int32", lambda k, v, m: (k, v, m.int()), TypeError, "block_mapping must have dtype"),
    ("mapping shape", lambda k, v, m: (k, v, m[:, :1]), ValueError, "block_mapping must have shape"),
    ("out of range", _bad_mapping([[1, 10]]), ValueError, r"in \[0, 10\)"),
    ("src is dst", _bad_mapping([[1, 2], [2, 3]]), ValueError, "both src and dst"),
    ("dst twice", _bad_mapping([[1, 2], [3, 2]]), ValueError, "repeated dst"),
    ("layer count", lambda k, v, m: (k, v[:-1], m), ValueError, "same non-zero number"),
    ("shape mix", lambda k, v, m: (k, [*v[:-1], v[-1][:5]], m), ValueError, "value_caches.2. must have shape"),
    ("dtype mix", lambda k, v, m: ([k[0], k[1].half(), k[2]], v, m), TypeError, "key_caches.1. must have dtype"),
    ("not lists", lambda k, v, m: (k[0], v[0], m), TypeError, "lists of tensors"),
]


@pytest.mark.parametrize("mutate,exc,match", [pytest.param(f, e, s, id=i) for i, f, e, s in BAD])
def test_wrapper_rejects_bad_inputs(mutate, exc, match):
    k, v = _caches()
    with pytest.raises(exc, match=match):
        copy_blocks(*mutate(k, v, torch.tensor([[1, 2]], dtype=torch.int64)))
