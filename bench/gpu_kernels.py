"""GPU kernel benchmark: paged decode vs contiguous SDPA, against copy bandwidth.

    python bench/gpu_kernels.py --out DIR [--quick]

Needs a CUDA device. Writes DIR/gpu_kernels.md (full tables) and appends one JSON line
per headline number to DIR/summary.jsonl as it is measured (bench/gpu_report.py turns
those into the final table). Every benchmarked paged output is also checked against SDPA's.

Decode setup: bf16, block_size 16, physical blocks in a random permutation, every
sequence at the full context; SDPA gets the same K/V laid out contiguously
[batch, kv_heads, context, head_dim] with enable_gqa (no K/V expansion).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_bench import time_ms  # noqa: E402

from kernels import paged_attention_ref  # noqa: E402
from kernels.triton_attention import paged_attention  # noqa: E402
from kernels.triton_decode import launch_paged_decode  # noqa: E402

SHAPES = {"llama-8b (32q/8kv x128)": (32, 8, 128), "smollm2 (9q/3kv x64)": (9, 3, 64)}
BATCHES, CONTEXTS = [1, 4, 16, 64, 256], [512, 2048, 8192]
TARGET = (64, 2048)  # paged decode >= 0.8x SDPA here
BLOCK = 16
DEVICE = "cuda"  # a module constant so a CPU dry run can swap it


def sdpa(q, k, v, causal=False):
    """SDPA with native GQA; older torch lacks enable_gqa, so expand K/V there."""
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:
        g = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)


def decode_case(batch, ctx, heads, kv_heads, dim, gen):
    """(paged args, sdpa q/k/v) over the same data; KV pages shuffled."""
    k = torch.randn(batch, kv_heads, ctx, dim, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    q = torch.randn(batch, heads, 1, dim, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    per_seq = ctx // BLOCK
    perm = torch.randperm(batch * per_seq, device=DEVICE, generator=gen)
    tables = perm.view(batch, per_seq).to(torch.int32)

    def paged(x):  # [B, kvh, L, D] -> [num_blocks, BLOCK, kvh, D] in shuffled order
        cache = torch.empty(batch * per_seq, BLOCK, kv_heads, dim, device=DEVICE, dtype=x.dtype)
        cache[perm] = x.permute(0, 2, 1, 3).reshape(batch * per_seq, BLOCK, kv_heads, dim)
        return cache

    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
    args = (q.view(batch, heads, dim), paged(k), paged(v), tables, lens, starts, dim ** -0.5)
    return args, (q, k, v)


def copy_bandwidth() -> float:
    """Device-to-device copy GB/s (read + write) of a 2 GiB buffer: the roofline."""
    x = torch.empty(2**30, dtype=torch.bfloat16, device=DEVICE)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), iters=20)
    return 2 * x.numel() * x.element_size() / ms / 1e6


def check_correctness(log) -> bool:
    """Compiled kernels against the torch twin on mixed batches (works without pytest)."""
    from tests.kernels.paged_batch import make_batch

    ok = True
    for dtype, tol in [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)]:
        for bs, kvh, g, d in [(16, 3, 3, 64), (32, 8, 4, 128), (8, 2, 1, 64)]:
            b = make_batch([(1, 700), (37, 37), (1, 5), (20, 300), (1, 2000)], block_size=bs, kv_heads=kvh,
                           group=g, head_dim=d, dtype=dtype)
            args = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in b.args()]
            out = torch.full_like(args[0], float("nan"))
            paged_attention(*args, out=out)
            err = (out.float().cpu() - paged_attention_ref(*b.args()).float()).abs().max().item()
            good = not out.isnan().any().item() and err <= tol
            ok &= good
            log(f"correctness {dtype} bs{bs} kvh{kvh} g{g} d{d}: max err {err:.2e} {'ok' if good else 'FAIL'}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/kvscope_gpu_check")
    parser.add_argument("--quick", action="store_true", help="smaller grid")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = []

    def log(line=""):
        print(line, flush=True)
        md.append(line)

    def note(check, result, target="", status="INFO"):
        # Written at once: if gpu_check.sh's time limit stops this script, the numbers
        # measured so far still reach the summary table.
        with open(out / "summary.jsonl", "a") as f:
            f.write(json.dumps(dict(check=check, result=result, target=target, status=status)) + "\n")

    assert torch.cuda.is_available(), "gpu_kernels.py needs a CUDA device"
    torch.backends.cuda.matmul.allow_tf32 = False
    log(f"## Kernel benchmarks on {torch.cuda.get_device_name()} (torch {torch.__version__})\n")
    good = check_correctness(log)
    note("compiled paged_attention vs twin (6 mixed batches)", "ok" if good else "MISMATCH", "all ok",
         "PASS" if good else "FAIL")
    bw = copy_bandwidth()
    log(f"\ncopy bandwidth (2 GiB d2d, read+write): {bw:.0f} GB/s\n")
    note("device copy bandwidth", f"{bw:.0f} GB/s")

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    batches = [1, 16, 64, 256] if args.quick else BATCHES
    for shape_name, (heads, kvh, dim) in SHAPES.items():
        log(f"\n### Decode, {shape_name}, bf16: paged (Triton) vs contiguous SDPA\n")
        log("| batch | context | splits | paged ms | SDPA ms | paged/SDPA speed | paged GB/s "
            "| % of copy BW | max diff |")
        log("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        best_bw = 0.0
        for batch in batches:
            for ctx in CONTEXTS:
                pargs, (q, k, v) = decode_case(batch, ctx, heads, kvh, dim, gen)
                o = torch.empty_like(pargs[0])
                splits = launch_paged_decode(o, *pargs, max_seq_len=ctx)
                t_p = time_ms(lambda: paged_attention(*pargs, out=o, max_query_len=1, max_seq_len=ctx))
                t_s = time_ms(lambda: sdpa(q, k, v))
                diff = (o - sdpa(q, k, v).view_as(o)).abs().max().item()
                gbs = 2 * k.numel() * k.element_size() / t_p / 1e6
                frac = gbs / bw
                if batch >= 64:
                    best_bw = max(best_bw, frac)
                log(f"| {batch} | {ctx} | {splits} | {t_p:.3f} | {t_s:.3f} | {t_s / t_p:.2f}x | {gbs:.0f} "
                    f"| {100 * frac:.0f}% | {diff:.1e} |")
                if (batch, ctx) == TARGET:
                    note(f"decode {shape_name} b{batch}/ctx{ctx}: paged vs SDPA speed", f"{t_s / t_p:.2f}x",
                         ">= 0.8x", "PASS" if t_s / t_p >= 0.8 else "FAIL")
                if diff > 6e-2:
                    note(f"decode {shape_name} b{batch}/ctx{ctx} output vs SDPA", f"max diff {diff:.1e}",
                         "<= 6e-2", "FAIL")
                del pargs, q, k, v, o
        note(f"decode {shape_name}: best % of copy BW at batch >= 64", f"{100 * best_bw:.0f}%", ">= 60%",
             "PASS" if best_bw >= 0.6 else "FAIL")
        torch.cuda.empty_cache()

    # Knob sweep at two points, to tune the defaults (tile_n, num_warps).
    log("\n### Decode knob sweep, llama-8b shape (ms)\n")
    log("| batch/context | tile_n | warps | ms |")
    log("|---|---:|---:|---:|")
    for batch, ctx in [TARGET, (256, 8192)] if not args.quick else [TARGET]:
        pargs, _ = decode_case(batch, ctx, 32, 8, 128, gen)
        o = torch.empty_like(pargs[0])
        best = None
        for tile_n in (32, 64, 128):
            for warps in (4, 8):
                ms = time_ms(lambda: launch_paged_decode(o, *pargs, max_seq_len=ctx, tile_n=tile_n, num_warps=warps))
                log(f"| {batch}/{ctx} | {tile_n} | {warps} | {ms:.3f} |")
                best = min(best or (ms, tile_n, warps), (ms, tile_n, warps))
        note(f"decode knob sweep b{batch}/ctx{ctx}: best tile_n/warps", f"{best[1]}/{best[2]} ({best[0]:.3f} ms)")
        del pargs, o

    log("\n### Prefill, llama-8b shape, bf16: paged (Triton) vs causal SDPA\n")
    log("| batch x prompt | paged ms | SDPA ms | paged/SDPA speed | max diff |")
    log("|---|---:|---:|---:|---:|")
    for batch, ctx in [(4, 2048), (1, 8192)]:
        pargs, (q1, k, v) = decode_case(batch, ctx, 32, 8, 128, gen)
        batch, heads, _, dim = q1.shape
        ctx = k.shape[2]
        q = torch.randn(batch, heads, ctx, dim, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        qp = q.permute(0, 2, 1, 3).reshape(batch * ctx, heads, dim)
        starts = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * ctx
        pa = (qp, *pargs[1:5], starts, pargs[6])
        o = paged_attention(*pa, max_query_len=ctx, max_seq_len=ctx)
        diff = (o.view(batch, ctx, heads, dim).transpose(1, 2) - sdpa(q, k, v, causal=True)).abs().max().item()
        t_p = time_ms(lambda: paged_attention(*pa, out=o, max_query_len=ctx, max_seq_len=ctx), iters=10)
        t_s = time_ms(lambda: sdpa(q, k, v, causal=True), iters=10)
        log(f"| {batch} x {ctx} | {t_p:.3f} | {t_s:.3f} | {t_s / t_p:.2f}x | {diff:.1e} |")
        if diff > 6e-2:
            note(f"prefill b{batch} x {ctx} output vs SDPA", f"max diff {diff:.1e}", "<= 6e-2", "FAIL")
        note(f"prefill b{batch} x {ctx}: paged vs causal SDPA speed", f"{t_s / t_p:.2f}x")
        del pargs, q, k, v, qp, pa, o

    (out / "gpu_kernels.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
