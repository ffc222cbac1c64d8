"""The C++ CPU decode kernel (kernels/cpu_attention.cpp) against the reference twin,
alone and inside the fast path's plan (with cascade groups and prefill chunks beside it)."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_attention
from kernels.reference import paged_attention_ref
from kernels.torch_paged import build_plan, paged_attention_fast
from tests.model_fast.test_torch_paged import _ragged_batch, _shared_prefix_batch


@pytest.fixture(scope="module", autouse=True)
def _built(cpu_compiler):
    cpu_attention.extension()


# head_dim 16/32/64/128 take the AVX-512 paths where the CPU has them, 24 the scalar loop
@pytest.mark.parametrize("head_dim", [16, 24, 32, 64, 128])
@pytest.mark.parametrize("seed", range(12))
def test_kernel_plan_matches_reference_on_random_ragged_batches(seed, head_dim):
    block_size = (1, 4, 16)[seed % 3]
    kv_heads, group = ((1, 1), (2, 2), (3, 3), (4, 1))[seed % 4]
    args = _ragged_batch(seed, block_size, kv_heads, group, head_dim)
    plan = build_plan(args[3], args[4], args[5], block_size, decode_kernel=True)
    n_decodes = sum(1 for a, b in zip(args[5][:-1].tolist(), args[5][1:].tolist()) if b - a == 1)
    assert (plan.kernel_decodes is not None) == (n_decodes > 0)
    if plan.kernel_decodes is not None:
        assert len(plan.kernel_decodes.rows) == n_decodes and not plan.decode_groups
    assert (plan.kernel_prefills is not None) == bool(plan.prefills)
    want = paged_attention_ref(*args, scale=0.25)
    got = paged_attention_fast(*args, scale=0.25, plan=plan)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(8))
def test_kernel_beside_cascade_groups_matches_reference(seed):
    block_size = (1, 4, 16)[seed % 3]
    kv_heads, group = ((1, 1), (2, 2), (3, 3), (4, 1))[seed % 4]
    args = list(_shared_prefix_batch(seed, block_size, kv_heads, group, head_dim=64))
    plan = build_plan(args[3], args[4], args[5], block_size, decode_kernel=True)
    want = paged_attention_ref(*args, scale=0.25)
    torch.testing.assert_close(paged_attention_fast(*args, scale=0.25, plan=plan), want, atol=2e-5, rtol=1e-5)


def test_strided_query_rows_and_the_torch_fallback_agree():
    query, kc, vc, tables, lens, starts = _ragged_batch(5, 4, 3, 3, head_dim=64)
    plan = build_plan(tables, lens, starts, 4, decode_kernel=True)
    assert plan.kernel_decodes is not None
    want = paged_attention_ref(query, kc, vc, tables, lens, starts, scale=0.3)
    # heads contiguous, rows strided (the model's q is a view of the fused q/k output)
    wide = torch.cat([query, torch.randn(query.shape[0], 2, 64)], dim=1)
    got = paged_attention_fast(wide[:, :query.shape[1]], kc, vc, tables, lens, starts, scale=0.3, plan=plan)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # float64 inputs are not the kernel's: the same plan falls back to gather + SDPA
    got64 = paged_attention_fast(query.double(), kc.double(), vc.double(), tables, lens, starts,
                                 scale=0.3, plan=plan)
    torch.testing.assert_close(got64.float(), want, atol=2e-5, rtol=1e-5)


def _prefill_batch(seed: int, head_dim: int):
    """Prefill chunks only: fresh prompts and chunks over a cached prefix, past one task's 16
    rows and one 32-key block, with a decode row between them that the kernel must not touch."""
    gen = torch.Generator().manual_seed(seed)
    block_size = (1, 16, 32)[seed % 3]
    kv_heads, group = ((1, 4), (2, 3), (3, 3), (4, 1), (1, 1), (2, 2))[seed % 6]
    chunks = [(2, 0), (17, 0), (40, 5), (100, 130), (3, 64)][: 3 + seed % 3]  # (q_len, cached prefix)
    lens = [q + p for q, p in chunks]
    num_blocks = sum(-(-n // block_size) for n in lens) + 9
    kc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    vc = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lens]
    tables.insert(1, [free.pop()])  # a decode of 1 token after the first chunk
    lens.insert(1, 1)
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q_lens = [chunks[0][0], 1, *(q for q, _ in chunks[1:])]
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(int(starts[-1]), kv_heads * group, head_dim, generator=gen)
    return query, kc, vc, block_tables, torch.tensor(lens, dtype=torch.int32), starts


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
@pytest.mark.parametrize("seed", range(6))
def test_prefill_kernel_matches_reference(seed, head_dim, monkeypatch):
    """Every prefill chunk of the step in one kernel call (SDPA is not called), causal over a
    cached prefix where there is one, within float32 rounding of the reference."""
    from kernels import torch_paged

    if not cpu_attention.extension().prefill_takes(head_dim):
        pytest.skip("this CPU has neither AVX-512 nor AVX2: prefills stay on SDPA")
    args = _prefill_batch(seed, head_dim)
    plan = build_plan(*args[3:], key_block_size(args[1]), decode_kernel=True)
    assert plan.kernel_prefills is not None and len(plan.kernel_prefills.q_lens) == len(plan.prefills)
    monkeypatch.setattr(torch_paged, "_attend_prefill", None)  # the kernel, or a TypeError
    got = paged_attention_fast(*args, scale=0.125, plan=plan)
    torch.testing.assert_close(got, paged_attention_ref(*args, scale=0.125), atol=2e-5, rtol=1e-5)


def key_block_size(key_cache: torch.Tensor) -> int:
    return key_cache.shape[1]


def test_prefill_kernel_writes_only_its_chunks_rows_and_takes_one_row_chunks():
    query, kc, vc, tables, lens, starts = _prefill_batch(2, 64)
    want = paged_attention_ref(query, kc, vc, tables, lens, starts, scale=0.125)
    q_lens = (starts[1:] - starts[:-1]).to(torch.int32)
    # every sequence as a chunk, the 1-token decode included; then all but the decode
    for keep in (torch.arange(len(lens)), torch.tensor([i for i in range(len(lens)) if i != 1])):
        out = torch.full_like(query, 7.0)
        cpu_attention.paged_prefill_attention(query, kc, vc, starts[:-1].long()[keep], q_lens[keep],
                                              tables[keep].contiguous(), lens[keep], 0.125, out)
        rows = torch.cat([torch.arange(int(starts[i]), int(starts[i + 1])) for i in keep.tolist()])
        torch.testing.assert_close(out[rows], want[rows], atol=2e-5, rtol=1e-5)
        untouched = torch.ones(query.shape[0], dtype=torch.bool)
        untouched[rows] = False
        assert torch.all(out[untouched] == 7.0)


def test_prefill_kernel_refuses_what_it_cannot_read():
    kc, vc = torch.randn(4, 4, 1, 16), torch.randn(4, 4, 1, 16)
    q, out = torch.randn(6, 1, 16), torch.empty(6, 1, 16)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    starts, q_lens = torch.tensor([0, 3]), torch.tensor([3, 3], dtype=torch.int32)

    def call(starts=starts, q_lens=q_lens, tables=tables, lens=torch.tensor([3, 8], dtype=torch.int32), kc=kc, vc=vc):
        cpu_attention.paged_prefill_attention(q, kc, vc, starts, q_lens, tables, lens, 1.0, out)

    call()
    with pytest.raises(RuntimeError, match="not a block of the cache"):
        call(tables=torch.tensor([[0, 1], [2, 4]], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="shorter than its chunk or does not fit"):
        call(lens=torch.tensor([2, 8], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="shorter than its chunk or does not fit"):
        call(lens=torch.tensor([3, 9], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="are not rows of query"):
        call(starts=torch.tensor([0, 4]))
    with pytest.raises(RuntimeError, match="are not rows of query"):
        call(q_lens=torch.tensor([3, 0], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="float32 caches"):
        call(kc=kc.bfloat16(), vc=vc.bfloat16())
    assert cpu_attention.can_run_prefill(q, kc, vc) and not cpu_attention.can_run_prefill(q, kc.bfloat16(),
                                                                                          vc.bfloat16())
    assert not cpu_attention.can_run_prefill(torch.randn(2, 1, 24), torch.randn(4, 4, 1, 24),
                                             torch.randn(4, 4, 1, 24))  # no vector path for 24


def test_kernel_refuses_reads_outside_the_cache():
    kc, vc = torch.randn(4, 4, 1, 16), torch.randn(4, 4, 1, 16)
    q, out = torch.randn(2, 1, 16), torch.empty(2, 1, 16)
    rows = torch.tensor([0, 1])
    ok_tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="not a block of the cache"):
        cpu_attention.paged_decode_attention(q, kc, vc, rows, torch.tensor([[0, 9], [2, 3]], dtype=torch.int32),
                                             torch.tensor([8, 8], dtype=torch.int32), 1.0, out)
    with pytest.raises(RuntimeError, match="does not fit its block table"):
        cpu_attention.paged_decode_attention(q, kc, vc, rows, ok_tables, torch.tensor([9, 1], dtype=torch.int32),
                                             1.0, out)
    with pytest.raises(RuntimeError, match="is not a query row"):
        cpu_attention.paged_decode_attention(q, kc, vc, torch.tensor([0, 2]), ok_tables,
                                             torch.tensor([3, 1], dtype=torch.int32), 1.0, out)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_attention.paged_decode_attention(q.double(), kc, vc, rows, ok_tables,
                                             torch.tensor([3, 1], dtype=torch.int32), 1.0, out)


def test_the_cpu_backend_plans_for_the_kernel_unless_turned_off(monkeypatch):
    from engine.model.attention import select_backend

    assert select_backend("torch", "cpu").decode_kernel is True
    monkeypatch.setattr(cpu_attention.KERNELS, "on", None)  # decided again, as in a fresh process
    monkeypatch.setenv("KVSCOPE_CPU_DECODE_KERNEL", "0")
    assert select_backend("torch", "cpu").decode_kernel is False


@pytest.mark.parametrize("head_dim", [64, 24])  # the AVX-512 path and the scalar loop
@pytest.mark.parametrize("seed", range(4))
def test_kernel_on_a_bf16_cache_is_the_kernel_on_its_widened_copy(seed, head_dim):
    """kv_cache_dtype="bfloat16": the kernel widens each row exactly, so on the AVX-512 path
    (explicit vector ops) its answer is bitwise the float32 kernel's on the same values; the
    scalar loop (which the compiler may contract differently) and the torch fallback agree
    to float32 rounding."""
    block_size = (4, 16)[seed % 2]
    query, kc, vc, tables, lens, starts = _ragged_batch(seed, block_size, 3, 3, head_dim)
    kb, vb = kc.bfloat16(), vc.bfloat16()
    assert cpu_attention.can_run(query, kb, vb) and not cpu_attention.can_run(query, kb, vc)
    plan = build_plan(tables, lens, starts, block_size, decode_kernel=True)
    assert plan.kernel_decodes is not None
    want = paged_attention_fast(query, kb.float(), vb.float(), tables, lens, starts, scale=0.25, plan=plan)
    got = paged_attention_fast(query, kb, vb, tables, lens, starts, scale=0.25, plan=plan)
    rows = plan.kernel_decodes.rows  # the decodes; the prefill chunks attend in bf16 (next test)
    if head_dim == 64 and torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert torch.equal(got[rows], want[rows])
    torch.testing.assert_close(got[rows], want[rows], atol=2e-5, rtol=1e-5)
    torch_plan = build_plan(tables, lens, starts, block_size, decode_kernel=False)
    fallback = paged_attention_fast(query, kb, vb, tables, lens, starts, scale=0.25, plan=torch_plan)
    torch.testing.assert_close(fallback[rows], want[rows], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_prefill_on_a_bf16_cache_attends_in_bf16(seed):
    """A prefill chunk over a bf16 cache runs SDPA in bf16 (the query rounded, the cache
    read as it is, as vLLM's bf16 attends): within bf16's rounding of the float32 answer on
    the widened cache, and not that answer itself. A float32 cache keeps float32."""
    from kernels.torch_paged import prefill_dtype

    block_size = (4, 16)[seed % 2]
    query, kc, vc, tables, lens, starts = _ragged_batch(seed, block_size, 3, 3, 64)
    kb, vb = kc.bfloat16(), vc.bfloat16()
    assert prefill_dtype(kb) == torch.bfloat16 and prefill_dtype(kc) == torch.float32
    plan = build_plan(tables, lens, starts, block_size, decode_kernel=True)
    assert plan.prefills
    prefill_rows = torch.cat([torch.arange(c.q0, c.q1) for c in plan.prefills])
    want = paged_attention_fast(query, kb.float(), vb.float(), tables, lens, starts, scale=0.25, plan=plan)
    got = paged_attention_fast(query, kb, vb, tables, lens, starts, scale=0.25, plan=plan)
    torch.testing.assert_close(got[prefill_rows], want[prefill_rows], atol=3e-2, rtol=3e-2)
    assert not torch.equal(got[prefill_rows], want[prefill_rows])  # it did round: bf16, not float32


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size,kv_heads,head_dim", [(1, 1, 16), (4, 3, 64), (16, 2, 24)])
def test_write_kv_is_the_reference_cache_write_bitwise(block_size, kv_heads, head_dim, cache_dtype):
    from kernels.reference import reshape_and_cache_ref
    from kernels.torch_paged import reshape_and_cache_fast

    g = torch.Generator().manual_seed(block_size * 100 + head_dim)
    num_blocks, T = 12, 9
    caches = [torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(cache_dtype)
              for _ in range(2)]
    # key and value as the model hands them: strided views of one fused projection row
    # (a bf16 cache's rows rounded to nearest even, ties and all: scaled so some land on them)
    fused = torch.randn(T, 3 * kv_heads + 1, head_dim, generator=g) * 1000
    key, value = fused[:, :kv_heads], fused[:, 2 * kv_heads:3 * kv_heads]
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T]
    assert cpu_attention.can_write(key, value, *caches)
    want = [c.clone() for c in caches]
    reshape_and_cache_ref(key, value, want[0], want[1], slots)
    reshape_and_cache_fast(key, value, caches[0], caches[1], slots, all_valid=True)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1])


def test_write_kv_refuses_a_slot_outside_the_cache():
    kc, vc = torch.zeros(2, 4, 1, 16), torch.zeros(2, 4, 1, 16)
    k = torch.ones(2, 1, 16)
    with pytest.raises(RuntimeError, match="is not a slot of the cache"):
        cpu_attention.write_kv(k, k, kc, vc, torch.tensor([3, 8]))
    assert not kc.any() and not vc.any()  # checked before anything is written


def test_the_kernels_run_on_every_torch_thread():
    """Built with -fopenmp (kernels/cpu_build.py), at::parallel_for splits a 64-sequence
    decode across torch's threads; built without it, the calling thread did all of it.
    The split is static, so the other thread's half shows in the process's CPU time
    however late a loaded box schedules it."""
    import time

    from kernels import cpu_build

    if not cpu_build.openmp_flags():
        pytest.skip("torch's threads are not OpenMP's here")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        D, kvh, G, hd, bs, L = 64, 3, 3, 64, 16, 1024
        nb = L // bs
        kc, vc = torch.randn(D * nb, bs, kvh, hd), torch.randn(D * nb, bs, kvh, hd)
        tables = torch.randperm(D * nb).view(D, nb).int()
        query, out = torch.randn(D, kvh * G, hd), torch.empty(D, kvh * G, hd)
        rows, lens = torch.arange(D), torch.full((D,), L, dtype=torch.int32)
        t_proc, t_main = time.process_time(), time.thread_time()
        for _ in range(3):
            cpu_attention.paged_decode_attention(query, kc, vc, rows, tables, lens, 0.125, out)
        main = time.thread_time() - t_main
        other = time.process_time() - t_proc - main
        assert other > 0.3 * main, f"the other torch thread did {other:.4f} s to the caller's {main:.4f} s"
    finally:
        torch.set_num_threads(before)
