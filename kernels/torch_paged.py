"""Fast pure-torch paged attention for the CPU: the engine's default CPU path.

Same semantics and shapes as `kernels.reference` (see its docstring), which stays the
simple twin that tests compare against. What makes this one faster:

- One plan per step (`PagedPlan`): the host-side facts (which sequences are decodes,
  their gather indices and padding mask) are worked out once and reused by all layers,
  instead of per layer and per sequence.
- Decodes (q_len == 1) run as a batch: one `index_select` gathers every decode
  sequence's whole blocks (padded to the group's longest context), then one
  `scaled_dot_product_attention` with an additive mask for the padding. Sequences of
  very different lengths are split into groups so padding stays bounded.
- Decodes whose contexts start with the same physical blocks (a shared system prompt
  hit in the prefix cache) attend to that shared prefix once per group: it is read
  once (a view when its block ids run in a row) and attended by all of the group's
  queries in one flash call; each sequence's own tail is a second, batched flash call,
  and the two are merged by their log-sum-exp ("cascade" attention).
- Prefill chunks use `scaled_dot_product_attention` per sequence (flash kernel on CPU,
  native GQA), causal with the cached prefix visible (bottom-right aligned mask); over a
  bf16 CPU cache in bf16 (`prefill_dtype`).
- Writes to the cache use `index_copy_` (no boolean mask, no sync) when every slot in
  the step is valid.
- With ``decode_kernel`` (the CPU backend's default where it builds), the decodes that
  share no prefix skip the gather and SDPA: one C++ call per layer reads their context
  straight from the cache (`kernels.cpu_attention`); over a float32 cache the prefill
  chunks take that file's prefill kernel, one call per layer for all of them (causal,
  GEMM-shaped, no gathered copy: ~2x SDPA's speed on a 210-token prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import cpu_attention
from kernels.paged_gather import gather_blocks
from kernels.torch_cascade import attend_decode_cascade

# Decode sequences are grouped so that padding every group to its own longest
# context wastes at most this fraction of the gathered slots; each extra group costs
# two more gathers and one more SDPA call per layer, so tiny groups are merged anyway.
_MAX_PAD_WASTE = 0.25
_MIN_GROUP = 4
# A decode group whose sequences all start with the same physical blocks (a shared
# prompt served from the prefix cache) attends to that prefix once for the whole
# group ("cascade" attention) when it is at least this many blocks long: the prefix
# is gathered once instead of once per sequence, and its scores are one GEMM.
_MIN_SHARED_BLOCKS = 4
# With the C++ decode kernel on, prefill chunks over a float32 cache take its prefill
# kernel too (one call a layer for all of them, no gathered copy); False keeps them on
# SDPA (``python -m bench.step_ab prefill_kernel``).
PREFILL_KERNEL = True


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Decode sequences attended together, padded to the group's longest context.

    With ``shared`` set, the first ``len(shared)`` blocks are the same physical blocks
    for every sequence of the group and ``blocks`` holds only what follows them.
    """

    rows: torch.Tensor  # int64 [D]; query rows (== output rows) of the group
    blocks: torch.Tensor  # int64 [D * nb]; physical block ids, padding points at block 0
    bias: torch.Tensor  # float32 [D, 1, 1, (ns + nb) * bs]; 0 = real context, -inf = past seq_len
    num_seqs: int
    num_blocks: int  # nb, per sequence, after the shared blocks
    shared: torch.Tensor | None = None  # int64 [ns]; blocks every sequence starts with
    shared_start: int | None = None  # set when ``shared`` is the id run start .. start + ns - 1


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One sequence whose chunk has more than one query token."""

    q0: int
    q1: int
    seq_len: int
    blocks: torch.Tensor  # int64 [nb]; the sequence's blocks covering seq_len
    mask: torch.Tensor | None  # bool [q_len, seq_len] (True = attend); None = plain causal


@dataclass(frozen=True, slots=True)
class KernelDecodes:
    """Decodes for the C++ kernel (kernels/cpu_attention.py): their own rows of the
    step's block tables and lengths, no padding plan needed."""

    rows: torch.Tensor  # int64 [D]; query (== output) rows
    block_tables: torch.Tensor  # int32 [D, max_blocks], contiguous
    seq_lens: torch.Tensor  # int32 [D]
    decodes: tuple[tuple[int, int, int], ...]  # (num_blocks, seq index, query row), for the fallback


@dataclass(frozen=True, slots=True)
class KernelPrefills:
    """The step's prefill chunks for the C++ kernel (kernels/cpu_attention.py), all in one call."""

    q_starts: torch.Tensor  # int64 [P]; each chunk's first query row
    q_lens: torch.Tensor  # int32 [P]
    block_tables: torch.Tensor  # int32 [P, max_blocks], contiguous
    seq_lens: torch.Tensor  # int32 [P]


@dataclass(frozen=True, slots=True)
class PagedPlan:
    """Per-step attention plan, shared by every layer of one forward pass."""

    decode_groups: tuple[DecodeGroup, ...]
    prefills: tuple[PrefillChunk, ...]
    num_tokens: int
    kernel_decodes: KernelDecodes | None = None
    kernel_prefills: KernelPrefills | None = None


def build_plan(
    block_tables: torch.Tensor,  # int32 [S, max_blocks]
    seq_lens: list[int] | torch.Tensor,  # [S]
    query_start_loc: list[int] | torch.Tensor,  # [S + 1]
    block_size: int,
    decode_kernel: bool = False,
) -> PagedPlan:
    """Work out the step's decode groups and prefill chunks (host side, once per step).

    ``decode_kernel``: the decodes outside cascade groups go to the C++ kernel
    (``PagedPlan.kernel_decodes``) instead of padded gather groups, and the prefill chunks
    to its prefill kernel (``PagedPlan.kernel_prefills``, where the caches suit it)."""
    lens = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
    starts = query_start_loc.tolist() if isinstance(query_start_loc, torch.Tensor) else list(query_start_loc)
    dev = block_tables.device
    tables = block_tables.long()
    decodes: list[tuple[int, int, int]] = []  # (num_blocks, seq index, query row)
    prefills: list[PrefillChunk] = []
    prefill_seqs: list[int] = []
    for s, seq_len in enumerate(lens):
        q0, q1 = starts[s], starts[s + 1]
        q_len = q1 - q0
        if q_len == 0:
            continue
        nb = -(-seq_len // block_size)
        if q_len == 1:
            decodes.append((nb, s, q0))
            continue
        mask = None
        if q_len != seq_len:  # a cached prefix: query j sees keys 0 .. seq_len - q_len + j
            mask = torch.ones(q_len, seq_len, dtype=torch.bool, device=dev).tril(seq_len - q_len)
        prefills.append(PrefillChunk(q0, q1, seq_len, tables[s, :nb], mask))
        prefill_seqs.append(s)
    groups: list[DecodeGroup] = []
    sharing, rest = _split_by_shared_prefix(decodes, tables, lens, block_size)
    kernel = None
    if decode_kernel and rest:
        seqs = [s for _, s, _ in rest]
        idx = torch.tensor(seqs, dtype=torch.int64, device=dev)
        kernel = KernelDecodes(
            rows=torch.tensor([r for _, _, r in rest], dtype=torch.int64, device=dev),
            block_tables=block_tables.index_select(0, idx).to(torch.int32).contiguous(),
            seq_lens=torch.tensor([lens[s] for s in seqs], dtype=torch.int32, device=dev),
            decodes=tuple(rest))
        rest = []
    for part in (*sharing, rest):
        groups.extend(_decode_groups(part, tables, lens, block_size))
    kernel_prefills = None
    if decode_kernel and prefills and PREFILL_KERNEL:
        idx = torch.tensor(prefill_seqs, dtype=torch.int64, device=dev)
        kernel_prefills = KernelPrefills(
            q_starts=torch.tensor([c.q0 for c in prefills], dtype=torch.int64, device=dev),
            q_lens=torch.tensor([c.q1 - c.q0 for c in prefills], dtype=torch.int32, device=dev),
            block_tables=block_tables.index_select(0, idx).to(torch.int32).contiguous(),
            seq_lens=torch.tensor([c.seq_len for c in prefills], dtype=torch.int32, device=dev))
    num_tokens = starts[-1] if starts else 0
    return PagedPlan(tuple(groups), tuple(prefills), num_tokens, kernel, kernel_prefills)


def _split_by_shared_prefix(decodes, tables, lens, block_size):
    """(sets of decodes that start with the same >= _MIN_SHARED_BLOCKS full physical
    blocks, the other decodes). Only sequences whose prompt was served from the same
    cached blocks share them: a request that computed its prompt before the others could
    hit it, or after its copy was evicted, holds its own copy."""
    by_first: dict[int, list[tuple[int, int, int]]] = {}
    for d in decodes:
        if lens[d[1]] >= _MIN_SHARED_BLOCKS * block_size:
            by_first.setdefault(int(tables[d[1], 0]), []).append(d)
    sharing, in_sets = [], set()
    for items in by_first.values():
        if len(items) < 2:
            continue
        full = min(lens[s] for _, s, _ in items) // block_size
        rows = tables[[s for _, s, _ in items], :full].tolist()
        common = 0
        while common < full and all(r[common] == rows[0][common] for r in rows):
            common += 1
        if common >= _MIN_SHARED_BLOCKS:
            sharing.append(items)
            in_sets.update(s for _, s, _ in items)
    return sharing, [d for d in decodes if d[1] not in in_sets]


def _decode_groups(decodes, tables, lens, block_size):
    """Split decodes (sorted by length) into groups with bounded padding."""
    if not decodes:
        return
    decodes = sorted(decodes)
    dev = tables.device
    group: list[tuple[int, int, int]] = []

    def emit(group):
        nb = group[-1][0]  # sorted: the last is the longest
        seqs = torch.tensor([s for _, s, _ in group], dtype=torch.int64, device=dev)
        cols = torch.arange(nb, device=dev)
        nbs = torch.tensor([n for n, _, _ in group], device=dev)
        blocks = torch.where(cols[None, :] < nbs[:, None], tables[seqs, :nb], 0)  # [D, nb]
        sl = torch.tensor([lens[s] for _, s, _ in group], device=dev)
        ns = _num_shared_blocks(blocks, min(lens[s] for _, s, _ in group) // block_size)
        shared = None
        shared_start = None
        if len(group) > 1 and ns >= _MIN_SHARED_BLOCKS:
            shared, blocks, nb = blocks[0, :ns], blocks[:, ns:], nb - ns
            ids = shared.tolist()
            if ids == list(range(ids[0], ids[0] + ns)):  # a prompt's blocks, taken in a row
                shared_start = ids[0]
        pos = torch.arange(((ns if shared is not None else 0) + nb) * block_size, device=dev)
        bias = torch.zeros(len(group), 1, 1, pos.shape[0], device=dev)
        bias.masked_fill_((pos[None, :] >= sl[:, None])[:, None, None, :], float("-inf"))
        rows = torch.tensor([r for _, _, r in group], dtype=torch.int64, device=dev)
        return DecodeGroup(rows, blocks.reshape(-1), bias, len(group), nb, shared, shared_start)

    for item in decodes:
        if group:
            n = len(group) + 1
            used = sum(g[0] for g in group) + item[0]
            waste = 1 - used / (n * item[0])
            if waste > _MAX_PAD_WASTE and len(group) >= _MIN_GROUP:
                yield emit(group)
                group = []
        group.append(item)
    if group:
        yield emit(group)


def _num_shared_blocks(blocks: torch.Tensor, full_blocks: int) -> int:
    """Leading columns of ``blocks`` [D, nb] equal in every row, capped at ``full_blocks``
    (blocks every sequence fills completely)."""
    same = (blocks == blocks[:1]).all(dim=0)[:full_blocks]
    return int(same.int().cumprod(0).sum())


def _attend_decode_group(query, key_cache, value_cache, grp: DecodeGroup, scale: float) -> torch.Tensor:
    """[D, heads, hd] for one decode group."""
    if grp.shared is not None:
        return attend_decode_cascade(query, key_cache, value_cache, grp, scale)
    kvh, hd = key_cache.shape[2], key_cache.shape[3]
    heads = query.shape[1]
    D, L = grp.num_seqs, grp.num_blocks * key_cache.shape[1]
    # [D, L, kvh, hd] -> [D, kvh, L, hd] as a strided view: SDPA reads it in place
    k = gather_blocks(key_cache, grp.blocks).view(D, L, kvh, hd).transpose(1, 2).float()
    v = gather_blocks(value_cache, grp.blocks).view(D, L, kvh, hd).transpose(1, 2).float()
    q = query.index_select(0, grp.rows).float().view(D, heads, 1, hd)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=grp.bias, scale=scale,
                                       enable_gqa=heads != kvh)  # [D, heads, 1, hd]
    return o.view(D, heads, hd)


def prefill_dtype(key_cache: torch.Tensor) -> torch.dtype:
    """What a prefill chunk's attention computes in: a bf16 cache on the CPU is read as it
    is and its query rounded to bf16 (the flash kernel's bf16 GEMMs: ~3x float32's on
    AVX512-BF16/AMX, as vLLM's bf16 attends); any other cache widens to float32."""
    return torch.bfloat16 if key_cache.dtype == torch.bfloat16 and key_cache.device.type == "cpu" else torch.float32


def _attend_prefill(query, key_cache, value_cache, c: PrefillChunk, scale: float) -> torch.Tensor:
    """[q_len, heads, hd] for one prefill chunk over its paged context."""
    kvh = key_cache.shape[2]
    dt = prefill_dtype(key_cache)
    k = gather_blocks(key_cache, c.blocks)[: c.seq_len].transpose(0, 1).to(dt)  # [kvh, L, hd]
    v = gather_blocks(value_cache, c.blocks)[: c.seq_len].transpose(0, 1).to(dt)
    q = query[c.q0:c.q1].to(dt).transpose(0, 1)  # [heads, q_len, hd]
    o = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=c.mask, is_causal=c.mask is None,
        scale=scale, enable_gqa=q.shape[0] != kvh,
    )  # [1, heads, q_len, hd]
    return o[0].transpose(0, 1)


def paged_attention_fast(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    plan: PagedPlan | None = None,
) -> torch.Tensor:
    """`paged_attention_ref` semantics; pass the step's `plan` to skip rebuilding it."""
    if plan is None:
        plan = build_plan(block_tables, seq_lens, query_start_loc, key_cache.shape[1])
    if out is None:
        out = torch.empty_like(query)
    groups = plan.decode_groups
    kd = plan.kernel_decodes
    if kd is not None:
        if cpu_attention.can_run(query, key_cache, value_cache) and cpu_attention.can_run(out, key_cache, value_cache):
            cpu_attention.paged_decode_attention(query, key_cache, value_cache, kd.rows, kd.block_tables,
                                                 kd.seq_lens, scale, out)
        else:  # inputs the kernel does not take (not float32, not on the CPU): the torch path
            groups = (*groups, *_decode_groups(list(kd.decodes), block_tables.long(), seq_lens.tolist(),
                                               key_cache.shape[1]))
    for grp in groups:
        res = _attend_decode_group(query, key_cache, value_cache, grp, scale)
        out.index_copy_(0, grp.rows, res.to(out.dtype))
    kp = plan.kernel_prefills
    if kp is not None and cpu_attention.can_run_prefill(query, key_cache, value_cache) and cpu_attention.can_run(
            out, key_cache, value_cache):
        cpu_attention.paged_prefill_attention(query, key_cache, value_cache, kp.q_starts, kp.q_lens,
                                              kp.block_tables, kp.seq_lens, scale, out)
        return out
    for c in plan.prefills:
        out[c.q0:c.q1] = _attend_prefill(query, key_cache, value_cache, c, scale).to(out.dtype)
    return out


def reshape_and_cache_fast(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    all_valid: bool | None = None,
) -> None:
    """`reshape_and_cache_ref` semantics; ``all_valid=True`` skips the padding filter."""
    if all_valid is None:
        all_valid = bool((slot_mapping >= 0).all())
    if not all_valid:
        valid = slot_mapping >= 0
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    if (cpu_attention.can_write(key, value, key_cache, value_cache) and slot_mapping.dtype == torch.int64
            and slot_mapping.is_contiguous()):
        cpu_attention.write_kv(key, value, key_cache, value_cache, slot_mapping)
        return
    num_blocks, block_size, kv_heads, head_dim = key_cache.shape
    key_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(
        0, slot_mapping, key.to(key_cache.dtype))
    value_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(
        0, slot_mapping, value.to(value_cache.dtype))
