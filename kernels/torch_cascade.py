"""Cascade attention for decodes that share a prompt prefix (pure torch, CPU path).

A decode group whose sequences all start with the same physical blocks (a shared
system prompt served from the prefix cache) reads that prefix once and attends all
of the group's queries to it together, then attends each sequence to its own tail,
and merges the two. Used by `kernels.torch_paged` for groups with ``shared`` set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels.paged_gather import gather_blocks

if TYPE_CHECKING:
    from kernels.torch_paged import DecodeGroup

# Flash attention for the CPU that also returns each row's log-sum-exp, which lets the
# shared-prefix part and the per-sequence part be computed apart and merged exactly.
_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend_decode_cascade(query, key_cache, value_cache, grp: DecodeGroup, scale: float) -> torch.Tensor:
    """[D, heads, hd]: the shared prefix once for the group, then each sequence's own tail.

    Both parts are attention over disjoint key sets; merged by their log-sum-exp, they
    equal attention over the whole context (same softmax, another summation order).
    """
    if _FLASH_LSE is None:
        return _attend_decode_cascade_gemm(query, key_cache, value_cache, grp, scale)
    bs, kvh, hd = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    heads = query.shape[1]
    g = heads // kvh
    D, Ls = grp.num_seqs, grp.num_blocks * bs
    Lp = grp.shared.shape[0] * bs
    q = query.index_select(0, grp.rows).float().view(D, kvh, g, hd)
    # prefix: every query row of the group against one copy of the prefix, per kv head
    kp = _shared_rows(key_cache, grp).view(1, Lp, kvh, hd).transpose(1, 2)  # [1, kvh, Lp, hd]
    vp = _shared_rows(value_cache, grp).view(1, Lp, kvh, hd).transpose(1, 2)
    qp = q.transpose(0, 1).reshape(1, kvh, D * g, hd)
    o, lse = _FLASH_LSE(qp, kp, vp, scale=scale)  # [1, kvh, D * g, hd], [1, kvh, D * g]
    o = o.view(kvh, D, g, hd).transpose(0, 1)  # [D, kvh, g, hd]
    if Ls:
        lse = lse.view(kvh, D, g).transpose(0, 1)  # [D, kvh, g]
        ks = gather_blocks(key_cache, grp.blocks).float().view(D, Ls, kvh, hd).transpose(1, 2)
        vs = gather_blocks(value_cache, grp.blocks).float().view(D, Ls, kvh, hd).transpose(1, 2)
        own_mask = grp.bias[..., Lp:]  # [D, 1, 1, Ls]
        o_own, lse_own = _FLASH_LSE(q, ks, vs, attn_mask=own_mask, scale=scale)
        # a sequence with no own keys (its context ends with the prefix) gets output 0
        # and log-sum-exp 0 from the op, not -inf: give it no weight
        lse_own = lse_own.masked_fill(torch.isinf(own_mask).all(-1), float("-inf"))
        m = torch.maximum(lse, lse_own)
        w, w_own = torch.exp(lse - m), torch.exp(lse_own - m)  # [D, kvh, g]
        o = (o * w[..., None] + o_own * w_own[..., None]) / (w + w_own)[..., None]
    return o.reshape(D, heads, hd)


def _shared_rows(cache: torch.Tensor, grp: DecodeGroup) -> torch.Tensor:
    """[ns * bs, kvh, hd] float: the shared prefix's rows; a view when its ids run in a row."""
    if grp.shared_start is not None:
        n, (_, bs, kvh, hd) = grp.shared.shape[0], cache.shape
        rows = cache[grp.shared_start:grp.shared_start + n].view(n * bs, kvh, hd)
    else:
        rows = gather_blocks(cache, grp.shared)
    return rows.float()


def _attend_decode_cascade_gemm(query, key_cache, value_cache, grp: DecodeGroup, scale: float) -> torch.Tensor:
    """[D, heads, hd]: the cascade with explicit scores (torch without the flash-LSE op).

    Scores over prefix and tail are concatenated before one softmax, so this is the
    same computation as attending to the whole context, in another order.
    """
    bs, kvh, hd = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    heads = query.shape[1]
    g = heads // kvh
    D, Ls = grp.num_seqs, grp.num_blocks * bs
    Lp = grp.shared.shape[0] * bs
    kp = _shared_rows(key_cache, grp).permute(1, 2, 0)  # [kvh, hd, Lp]
    vp = _shared_rows(value_cache, grp).transpose(0, 1)  # [kvh, Lp, hd]
    q = query.index_select(0, grp.rows).float().view(D, kvh, g, hd)
    # prefix: one GEMM per kv head for all D * g query rows
    qh = q.transpose(0, 1).reshape(kvh, D * g, hd)
    s_prefix = torch.bmm(qh, kp).view(kvh, D, g, Lp).transpose(0, 1)  # [D, kvh, g, Lp]
    parts = [s_prefix]
    if Ls:
        ks = gather_blocks(key_cache, grp.blocks).float().view(D, Ls, kvh, hd)
        parts.append(torch.matmul(q, ks.permute(0, 2, 3, 1)))  # [D, kvh, g, Ls]
    scores = torch.cat(parts, dim=-1) * scale + grp.bias  # [D, kvh, g, Lp + Ls]
    probs = torch.softmax(scores, dim=-1)
    p_prefix = probs[..., :Lp].transpose(0, 1).reshape(kvh, D * g, Lp)
    o = torch.bmm(p_prefix, vp).view(kvh, D, g, hd).transpose(0, 1)  # [D, kvh, g, hd]
    if Ls:
        vs = gather_blocks(value_cache, grp.blocks).float().view(D, Ls, kvh, hd).transpose(1, 2)
        o = o + torch.matmul(probs[..., Lp:], vs)
    return o.reshape(D, heads, hd)
