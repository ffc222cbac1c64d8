"""The C++ kernels run without the GIL, as torch's own ops do: while the engine thread is
inside one, a server's event loop and recorder threads run Python (before, each kernel
call held every other thread of the process for its whole length)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from kernels import cpu_attention, cpu_fused, cpu_linear, cpu_mkl

# Stamps this close to the call's ends can come from before or after it: getting into and
# out of the C++ call can hand the GIL over at a switch interval (5 ms) or two.
MARGIN_S = 0.02


def _stamps_inside(call) -> tuple[float, float]:
    """For how long another Python thread ran while ``call()`` was inside C++ (the span of
    its stamps in the window), and how long the window was. A kernel holding the GIL
    gives ~0: no Python runs in the window, only a few stamps at one of its edges."""
    stamps: list[float] = []
    stop = threading.Event()

    def stamper() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())

    t = threading.Thread(target=stamper, daemon=True)
    t.start()
    while not stamps:
        time.sleep(0.001)
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    stop.set()
    t.join()
    lo, hi = t0 + MARGIN_S, t1 - MARGIN_S
    inside = [s for s in stamps if lo < s < hi]
    return (inside[-1] - inside[0] if inside else 0.0), hi - lo


def _long_enough(make, scale: int = 1):
    """A call of ``make(scale)``, scaled up until one call takes >= 0.15 s here (timed
    after a first call, which also pays for touching its fresh memory)."""
    for _ in range(8):
        call = make(scale)
        call()
        t0 = time.perf_counter()
        call()
        if time.perf_counter() - t0 >= 0.15:
            return call
        scale *= 2
    return call


def _silu_mul(scale: int):
    gate_up, out = torch.randn(256 * scale, 16384), torch.empty(256 * scale, 8192)
    return lambda: cpu_fused.extension().silu_mul(gate_up, out)


def _int8_dequantize(scale: int):
    n, k = 512 * scale, 4096
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scales, offsets, out = torch.rand(n, k // 32), torch.zeros(n, k // 32), torch.empty(n, k)
    return lambda: cpu_linear.extension().int8_dequantize(w, scales, offsets, out)


def _f32_linear(scale: int):
    w, x = torch.randn(4096 * scale, 1024), torch.randn(16, 1024)
    return lambda: cpu_linear.extension().f32_linear(x, w, None)


def _write_kv(scale: int):
    t, heads, hd = 131072 * scale, 4, 64  # one token's row, repeated (row stride 0)
    key, value = torch.randn(1, heads, hd).expand(t, heads, hd), torch.randn(1, heads, hd).expand(t, heads, hd)
    key_cache, value_cache = torch.empty(64, 16, heads, hd), torch.empty(64, 16, heads, hd)
    slots = torch.randint(0, 64 * 16, (t,))
    return lambda: cpu_attention.extension().write_kv(key, value, key_cache, value_cache, slots)


def _mkl_linear(scale: int):
    if not cpu_mkl.extension().available():
        pytest.skip("this torch build carries no MKL packed GEMM")
    w, x = torch.randn(4096, 1024), torch.randn(64 * scale, 1024)
    packed = cpu_mkl.pack(w)
    return lambda: cpu_mkl.linear(x, packed, 4096)


@pytest.mark.parametrize("make", [_silu_mul, _int8_dequantize, _f32_linear, _write_kv, _mkl_linear],
                         ids=lambda f: f.__name__[1:])
def test_a_kernel_call_lets_other_python_threads_run(cpu_compiler, make):
    call = _long_enough(make)
    ran, window = _stamps_inside(call)
    # released: the other thread runs through the call (on a busy box, in slices)
    assert ran >= 0.3 * window, (f"another thread ran {ran * 1e3:.1f} ms of a {window * 1e3:.0f} ms "
                                 f"window inside the kernel call: it holds the GIL")
