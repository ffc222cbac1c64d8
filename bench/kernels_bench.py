"""Time each Triton kernel against its torch reference twin.

    python bench/kernels_bench.py [--out results.md]

On CUDA: bf16, realistic sizes, CUDA-event timing, median of runs. On CPU the kernels
only run in Triton's interpreter, so the numbers are meaningless there (tiny sizes,
one run): it is a smoke test that the benchmark itself works.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import envs  # noqa: E402

if not torch.cuda.is_available():
    envs.TRITON_INTERPRET.set_default("1")  # before triton is imported
from kernels import copy_blocks_ref, paged_attention_ref, reshape_and_cache_ref  # noqa: E402
from kernels.triton_attention import paged_attention  # noqa: E402
from kernels.triton_cache import reshape_and_cache  # noqa: E402
from kernels.triton_copy import copy_blocks  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def time_ms(fn, *, iters: int = 20, warmup: int = 3) -> float:
    """Median milliseconds per call: CUDA events on GPU, perf_counter on CPU.

    On GPU the device is kept busy (a ~0.5 ms spin kernel) while the host records the
    start event and enqueues `fn`, so the events time the kernels, not the Python
    wrapper's checks and launch overhead (tens of microseconds, as much as a whole
    decode kernel at small sizes). A `fn` that syncs with the host is still timed whole.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(1_000_000)  # cycles: ~0.5 ms at boost clock
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def paged_batch(specs, *, block_size=16, kv_heads=8, group=4, head_dim=128, dtype=torch.bfloat16, seed=0):
    """Random paged batch on DEVICE; specs = [(query_len, seq_len)]. Blocks shuffled."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    per_seq = [-(-n // block_size) for _, n in specs]
    num_blocks = sum(per_seq) + 1
    perm = torch.randperm(num_blocks, device=DEVICE, generator=g).to(torch.int32)
    tables = torch.zeros(len(specs), max(per_seq), dtype=torch.int32, device=DEVICE)
    used = 0
    for s, nb in enumerate(per_seq):
        tables[s, :nb] = perm[used:used + nb]
        used += nb
    shape = (num_blocks, block_size, kv_heads, head_dim)
    kc = torch.randn(shape, device=DEVICE, dtype=dtype, generator=g)
    vc = torch.randn(shape, device=DEVICE, dtype=dtype, generator=g)
    q = torch.randn(sum(q for q, _ in specs), kv_heads * group, head_dim, device=DEVICE, dtype=dtype, generator=g)
    starts = torch.tensor([0] + [q for q, _ in specs], device=DEVICE).cumsum(0).to(torch.int32)
    lens = torch.tensor([n for _, n in specs], dtype=torch.int32, device=DEVICE)
    return (q, kc, vc, tables, lens, starts, head_dim ** -0.5)


def cases():
    """(name, triton_fn, reference_fn, bytes_moved) per benchmark case."""
    big = CUDA
    out = []
    for kind, specs in [
        ("decode", [(1, 2048)] * 64 if big else [(1, 64)] * 2),
        ("prefill", [(512, 512)] * 4 if big else [(16, 16)]),
        ("mixed", [(1, 1024)] * 32 + [(256, 768)] * 2 if big else [(1, 40), (8, 20)]),
    ]:
        label = f"{kind} {len(specs)} seqs, {sum(q for q, _ in specs)} q tok, ctx<={max(n for _, n in specs)}"
        args = paged_batch(specs) if big else paged_batch(specs, kv_heads=1, group=2, head_dim=64)
        q, kc = args[0], args[1]
        kv_bytes = sum(n for _, n in specs) * kc.shape[2] * kc.shape[3] * kc.element_size() * 2
        hints = dict(max_query_len=max(q for q, _ in specs), max_seq_len=max(n for _, n in specs))  # as the engine
        out.append((f"paged_attention {label}", lambda a=args, h=hints: paged_attention(*a, **h),
                    lambda a=args: paged_attention_ref(*a), kv_bytes + 2 * q.numel() * q.element_size()))

    tokens, (nb, bs, kvh, hd) = (4096, (4096, 16, 8, 128)) if big else (8, (8, 16, 1, 64))
    kc = torch.zeros(nb, bs, kvh, hd, dtype=torch.bfloat16, device=DEVICE)
    vc = torch.zeros_like(kc)
    k = torch.randn(tokens, kvh, hd, dtype=torch.bfloat16, device=DEVICE)
    v = torch.randn_like(k)
    slots = torch.randperm(nb * bs, device=DEVICE)[:tokens]
    rw = 4 * k.numel() * k.element_size()  # read K and V, write them
    out.append((f"reshape_and_cache {tokens} tok", lambda: reshape_and_cache(k, v, kc, vc, slots),
                lambda: reshape_and_cache_ref(k, v, kc, vc, slots), rw))

    layers, pairs = (30, 64) if big else (2, 2)
    kcs = [torch.zeros(256, 16, 3, 64, dtype=torch.bfloat16, device=DEVICE) for _ in range(layers)]
    vcs = [torch.zeros_like(c) for c in kcs]
    mapping = torch.stack([torch.arange(pairs), torch.arange(pairs) + 128], 1)
    mapping_dev = mapping.to(DEVICE)
    cp = 2 * 2 * layers * pairs * kcs[0][0].numel() * 2
    out.append((f"copy_blocks {layers} layers x {pairs}", lambda: copy_blocks(kcs, vcs, mapping_dev),
                lambda: copy_blocks_ref(kcs, vcs, mapping_dev), cp))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()
    if not CUDA:
        print("No CUDA device: kernels run in Triton's interpreter; timings are meaningless.\n")
    iters = 20 if CUDA else 1
    rows = ["| kernel | triton ms | reference ms | speed-up | triton GB/s |", "|---|---:|---:|---:|---:|"]
    for name, fn, ref, nbytes in cases():
        t = time_ms(fn, iters=iters, warmup=3 if CUDA else 1)
        try:
            r = time_ms(ref, iters=iters, warmup=1)
            ref_cols = f"{r:.3f} | {r / t:.1f}x"
        except Exception as e:  # a broken twin should not hide the kernel's numbers
            print(f"reference for {name} failed: {type(e).__name__}: {e}")
            ref_cols = "failed | -"
        rows.append(f"| {name} | {t:.3f} | {ref_cols} | {nbytes / t / 1e6:.0f} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    print("\n" + table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
