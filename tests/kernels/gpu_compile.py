"""Compile every kernel, as its wrapper would launch it, for NVIDIA GPUs, without one.

The interpreter is lenient: it accepts code the real compiler rejects (loop-carried
type changes, unsupported ops) and never checks shared memory. This script records
the exact kwargs each wrapper passes at launch, then runs Triton's full pipeline
(TTIR -> TTGIR -> LLVM -> PTX -> cubin via the bundled ptxas) for sm_80 and sm_90.

Run as `python -m tests.kernels.gpu_compile [--quick]` in a process where
TRITON_INTERPRET is unset; prints one line per compiled variant and exits non-zero on
any failure. --quick (the test suite's mode) does sm_90 and the bf16/fp32 variants only.
"""

from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels.triton_attention as attention  # noqa: E402
import kernels.triton_cache as cache  # noqa: E402
import kernels.triton_checks as checks  # noqa: E402
import kernels.triton_copy as copy  # noqa: E402
import kernels.triton_decode as decode  # noqa: E402
import kernels.triton_prefill as prefill  # noqa: E402
from tests.kernels.paged_batch import make_batch  # noqa: E402

TARGETS = [GPUTarget("cuda", 90, 32), GPUTarget("cuda", 80, 32)]
TL_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
            torch.int32: "i32", torch.int64: "i64"}


class Recorder:
    """Stands in for a JITFunction: `kernel[grid](**kwargs)` records instead of launching."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        return lambda **kwargs: self.calls.append(kwargs)


def _signature(fn, kwargs):
    """(signature, constexprs, attrs) as a real launch would specialise them: ints equal
    to 1 become constants; pointers and ints that are multiples of 16 get the
    divisibility hint that enables vectorised loads."""
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        v = kwargs[p.name]
        if p.is_constexpr or (type(v) is int and v == 1):
            sig[p.name], consts[p.name] = "constexpr", v
            continue
        if isinstance(v, torch.Tensor):
            sig[p.name] = "*" + TL_TYPES[v.dtype]
            aligned = v.data_ptr() % 16 == 0
        elif isinstance(v, float):
            sig[p.name], aligned = "fp32", False
        else:
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
            aligned = v % 16 == 0
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def record_launches(quick: bool) -> list[tuple[str, object, dict]]:
    """Call each wrapper on small CPU inputs; return (label, jit_fn, kwargs) per launch."""
    recorders = {}
    for mod, name in [(decode, "_paged_decode_kernel"), (decode, "_decode_reduce_kernel"),
                      (prefill, "_paged_prefill_kernel"), (cache, "_reshape_and_cache_kernel"),
                      (copy, "_copy_blocks_kernel")]:
        recorders[name] = Recorder(getattr(mod, name))
        setattr(mod, name, recorders[name])
    checks.interpreting = lambda kernel=None: True  # let CPU tensors through the device check
    launches = []

    def take(label, **fix):
        for name, rec in recorders.items():
            for kw in rec.calls:
                launches.append((f"{label}:{name}", rec.fn, {**kw, **{k: v for k, v in fix.items() if k in kw}}))
            rec.calls.clear()

    variants = [(torch.bfloat16, 3, 3, 64, 16), (torch.float16, 8, 4, 128, 32), (torch.float32, 2, 1, 128, 8)]
    for dtype, kvh, group, hd, bs in variants[::2] if quick else variants:
        for specs in [(1, 900), (1, 40), (17, 300)], [(1, 900)], [(17, 300)]:  # lone seqs: num_seqs == 1
            b = make_batch(specs, block_size=bs, kv_heads=kvh, group=group, head_dim=hd, dtype=dtype)
            attention.paged_attention(*b.args())
            take(f"attention-{TL_TYPES[dtype]}-d{hd}-g{group}-{len(specs)}seq", FP32_DOT=dtype == torch.float32)
        if not quick:
            decode.launch_paged_decode(torch.empty_like(b.query), *b.args(), max_seq_len=900, num_splits=1)
            take(f"decode-nosplit-{TL_TYPES[dtype]}", FP32_DOT=dtype == torch.float32)
        kv = torch.zeros(7, kvh, hd, dtype=dtype)
        cache.reshape_and_cache(kv, kv, b.key_cache, b.value_cache, torch.arange(7))
        take(f"cache-{TL_TYPES[dtype]}")
        copy.copy_blocks([b.key_cache], [b.value_cache], torch.tensor([[0, 1]]))
        take(f"copy-{TL_TYPES[dtype]}")
    return launches


def main() -> int:
    quick = "--quick" in sys.argv
    failures = 0
    for label, fn, kwargs in record_launches(quick):
        sig, consts, attrs = _signature(fn, kwargs)
        for target in TARGETS[:1] if quick else TARGETS:
            try:
                k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=target,
                                   options=dict(num_warps=4, num_stages=3))
                print(f"ok   sm_{target.arch} {label}  shared={k.metadata.shared}B")
            except Exception as e:  # report every variant, then fail
                failures += 1
                print(f"FAIL sm_{target.arch} {label}: {type(e).__name__}: {e}".splitlines()[0])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
