"""reshape_and_cache: scatter this step's new K/V rows into the paged cache by slot.

Twin: kernels.reference.reshape_and_cache_ref. One program copies (a chunk of) one
token's [num_kv_heads * head_dim] row for both K and V; the row is contiguous in the
input and in its cache slot, so the copy is one flat masked load/store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_checks import FLOAT_DTYPES, check_same_device, check_tensor, next_pow2, require

# Elements per program: big enough to amortise the slot lookup, small enough that
# wide rows (32 heads x 128) still spread over several programs.
MAX_CHUNK = 1024


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]; [kv_heads, head_dim] contiguous
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]; same layout rule as key
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # int32/int64 [num_tokens]; slot = block * block_size + offset, < 0 = skip
    num_slots,  # num_blocks * block_size; slots past it are never written
    stride_kt,  # key: elements between tokens
    stride_vt,  # value: elements between tokens
    stride_kcb,  # key_cache: elements between blocks
    stride_kcs,  # key_cache: elements between slots of a block
    stride_vcb,  # value_cache: elements between blocks
    stride_vcs,  # value_cache: elements between slots of a block
    BLOCK_SIZE: tl.constexpr,  # token slots per cache block
    ROW: tl.constexpr,  # num_kv_heads * head_dim: elements per token per tensor
    CHUNK: tl.constexpr,  # power of two; elements this program copies
):
    token = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    # Padding tokens (slot < 0) are masked rather than returned early so one code
    # path covers both; the clamp keeps the (unused) address in range.
    keep = (slot >= 0) & (slot < num_slots)
    slot = tl.maximum(slot, 0)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    # Not `(cols < ROW) & keep`: the interpreter turns block & scalar-bool into ints.
    mask = cols < tl.where(keep, ROW, 0)
    k = tl.load(key_ptr + token.to(tl.int64) * stride_kt + cols, mask=mask)
    v = tl.load(value_ptr + token.to(tl.int64) * stride_vt + cols, mask=mask)
    kc = key_cache_ptr + block * stride_kcb + offset * stride_kcs + cols
    vc = value_cache_ptr + block * stride_vcb + offset * stride_vcs + cols
    tl.store(kc, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V rows into the paged cache, in place, by slot (slot < 0 = skip).

    key/value [num_tokens, num_kv_heads, head_dim] may be strided views over tokens
    (e.g. slices of a fused QKV output) but each token's [kv_heads, head_dim] row must
    be dense. Rows are cast to the cache dtype. Slots >= num_blocks * block_size are
    not written (the reference raises IndexError); checking would need a device sync.
    """
    check_tensor("key_cache", key_cache, ndim=4, dtypes=FLOAT_DTYPES, inner_contiguous=2)
    num_blocks, block_size, kv_heads, head_dim = key_cache.shape
    check_tensor("value_cache", value_cache, shape=key_cache.shape, dtypes=(key_cache.dtype,), inner_contiguous=2)
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES, shape=(None, kv_heads, head_dim), inner_contiguous=2)
    num_tokens = key.shape[0]
    check_tensor("value", value, shape=key.shape, dtypes=(key.dtype,), inner_contiguous=2)
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int64, torch.int32), shape=(num_tokens,))
    require(
        slot_mapping.stride(0) == 1 or num_tokens <= 1,
        "slot_mapping must be contiguous (use .contiguous())",
    )
    check_same_device(
        _reshape_and_cache_kernel,
        key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping,
    )
    if num_tokens == 0:
        return
    row = kv_heads * head_dim
    chunk = min(next_pow2(row), MAX_CHUNK)
    grid = (num_tokens, triton.cdiv(row, chunk))
    _reshape_and_cache_kernel[grid](
        key_ptr=key,
        value_ptr=value,
        key_cache_ptr=key_cache,
        value_cache_ptr=value_cache,
        slot_mapping_ptr=slot_mapping,
        num_slots=num_blocks * block_size,
        stride_kt=key.stride(0),
        stride_vt=value.stride(0),
        stride_kcb=key_cache.stride(0),
        stride_kcs=key_cache.stride(1),
        stride_vcb=value_cache.stride(0),
        stride_vcs=value_cache.stride(1),
        BLOCK_SIZE=block_size,
        ROW=row,
        CHUNK=chunk,
    )
