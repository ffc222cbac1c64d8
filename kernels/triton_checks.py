"""Launch-side checks shared by the Triton kernel wrappers.

Every wrapper validates its inputs here before launching, so a wrong shape, dtype,
layout or device fails with a message naming the argument instead of a silent wrong
answer or an illegal memory access inside the kernel.

Mode: on a CUDA device the kernels run compiled. Without one they can only run in
Triton's interpreter (TRITON_INTERPRET=1, which must be set before triton is first
imported; tests/conftest.py does this) on torch CPU tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton

from engine import envs

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting(kernel: object | None = None) -> bool:
    """True when Triton kernels run in the interpreter rather than compiled."""
    if kernel is not None:
        from triton.runtime.interpreter import InterpretedFunction

        return isinstance(kernel, InterpretedFunction)
    return envs.TRITON_INTERPRET.get()


def require(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
    """Raise `exc(msg)` unless `cond`."""
    if not cond:
        raise exc(msg)


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
    inner_contiguous: int = 0,
) -> torch.Tensor:
    """Check one argument; `shape` entries of None are free.

    inner_contiguous=n requires the last n dims to be laid out densely (row-major),
    which the kernels rely on to address them with a single flat offset.
    """
    require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
    assert isinstance(t, torch.Tensor)
    if ndim is not None:
        require(t.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        require(t.dtype in dtypes, f"{name} must have dtype in ({names}), got {t.dtype}", TypeError)
    if shape is not None:
        ok = len(shape) == t.dim() and all(w is None or w == s for w, s in zip(shape, t.shape))
        want = tuple("*" if w is None else w for w in shape)
        require(ok, f"{name} must have shape {want}, got {tuple(t.shape)}")
    if inner_contiguous:
        expected = 1
        for d in range(t.dim() - 1, t.dim() - 1 - inner_contiguous, -1):
            if t.shape[d] > 1:
                require(
                    t.stride(d) == expected,
                    f"{name} must be contiguous in its last {inner_contiguous} dim(s); "
                    f"got strides {t.stride()} for shape {tuple(t.shape)} (use .contiguous())",
                )
            expected *= t.shape[d]
    return t


def check_same_device(kernel: object, **tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and one the kernel can run on."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{n}={d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    if first.type != "cuda" and not interpreting(kernel):
        raise RuntimeError(
            f"Triton kernels need CUDA tensors (got {first}); on CPU set TRITON_INTERPRET=1 "
            "before triton is imported, or use the *_ref twins in kernels.reference"
        )
    return first


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (tl.arange needs power-of-two extents)."""
    return triton.next_power_of_2(max(int(n), 1))


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on `device`; a small stand-in under the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def fp32_dot(dtype: torch.dtype, kernel: object) -> bool:
    """Whether attention dots should run in exact fp32 (the kernels' FP32_DOT flag).

    fp32 inputs: yes, TF32 would lose ~3 digits against the fp32 reference.
    bf16 under the interpreter: yes, its tl.dot multiplies bf16 bit patterns as
    uint16 integers (Triton 3.x), so the operands are upcast first.
    """
    return dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting(kernel))
