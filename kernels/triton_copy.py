"""copy_blocks: copy whole cache blocks src -> dst in every layer (copy-on-write).

Twin: kernels.reference.copy_blocks_ref. One launch covers all layers: the caches'
base addresses go in a small int64 table that each program turns back into a typed
pointer, so 30 layers cost one launch, not 60.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_checks import FLOAT_DTYPES, check_same_device, check_tensor, next_pow2, require

# Elements per program; a 16-token block of 3 heads x 64 is 3072 elements.
MAX_CHUNK = 2048


@triton.jit
def _copy_blocks_kernel(
    cache_ptrs_ptr,  # int64 [2 * num_layers]: data_ptr() of every key and value cache
    dtype_ptr,  # any one cache [num_blocks, block_size, kv_heads, head_dim]; gives the element type
    block_mapping_ptr,  # int64 [num_pairs, 2]: (src, dst) physical block ids
    stride_block,  # elements between consecutive blocks, shared by all caches
    BLOCK_NUMEL: tl.constexpr,  # block_size * kv_heads * head_dim, dense inside a block
    CHUNK: tl.constexpr,  # power of two; elements this program copies
):
    cache = tl.program_id(0)
    pair = tl.program_id(1)
    chunk = tl.program_id(2)
    base = tl.load(cache_ptrs_ptr + cache).to(tl.pointer_type(dtype_ptr.dtype.element_ty))
    src = tl.load(block_mapping_ptr + pair * 2)
    dst = tl.load(block_mapping_ptr + pair * 2 + 1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < BLOCK_NUMEL
    x = tl.load(base + src * stride_block + offs, mask=mask)
    tl.store(base + dst * stride_block + offs, x, mask=mask)


def copy_blocks(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy whole blocks src -> dst in every layer's caches, in place.

    All caches must share shape, dtype, device and strides, with each block dense.
    block_mapping is int64 [num_pairs, 2] on CPU or on the caches' device. A dst must
    not also be a src in the same call (programs run concurrently); copy-on-write
    never does that because dst is always freshly allocated.
    """
    require(isinstance(key_caches, (list, tuple)) and isinstance(value_caches, (list, tuple)),
            "key_caches and value_caches must be lists of tensors", TypeError)
    require(len(key_caches) == len(value_caches) and len(key_caches) > 0,
            f"need the same non-zero number of key and value caches, got {len(key_caches)} and {len(value_caches)}")
    check_tensor("block_mapping", block_mapping, ndim=2, dtypes=(torch.int64,), shape=(None, 2))
    first = check_tensor("key_caches[0]", key_caches[0], ndim=4, dtypes=FLOAT_DTYPES, inner_contiguous=3)
    caches = [*key_caches, *value_caches]
    names = [f"key_caches[{i}]" for i in range(len(key_caches))]
    names += [f"value_caches[{i}]" for i in range(len(value_caches))]
    for name, c in zip(names, caches):
        check_tensor(name, c, shape=first.shape, dtypes=(first.dtype,), inner_contiguous=3)
        require(c.stride() == first.stride(), f"{name} has strides {c.stride()}, key_caches[0] has {first.stride()}")
    device = check_same_device(_copy_blocks_kernel, **dict(zip(names, caches)))
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    if block_mapping.device.type == "cpu":
        # Cheap host-side checks: an id out of range would be an illegal access, and a
        # dst that is also a src would race.
        num_blocks = first.shape[0]
        require(bool(((block_mapping >= 0) & (block_mapping < num_blocks)).all()),
                f"block_mapping ids must be in [0, {num_blocks})")
        src, dst = set(block_mapping[:, 0].tolist()), block_mapping[:, 1].tolist()
        require(len(set(dst)) == len(dst), "block_mapping has a repeated dst block")
        require(not src.intersection(dst), "block_mapping uses a block as both src and dst")
        block_mapping = block_mapping.to(device)
    else:
        require(block_mapping.device == device, f"block_mapping is on {block_mapping.device}, caches on {device}")
    block_mapping = block_mapping.contiguous()
    cache_ptrs = torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64, device=device)
    block_numel = first[0].numel()
    chunk = min(next_pow2(block_numel), MAX_CHUNK)
    grid = (len(caches), num_pairs, triton.cdiv(block_numel, chunk))
    _copy_blocks_kernel[grid](
        cache_ptrs_ptr=cache_ptrs,
        dtype_ptr=first,
        block_mapping_ptr=block_mapping,
        stride_block=first.stride(0),
        BLOCK_NUMEL=block_numel,
        CHUNK=chunk,
    )
