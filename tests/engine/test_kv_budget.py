"""The CUDA KV budget arithmetic (the profile itself needs a GPU: bench/gpu_check.sh)."""

from engine.startup import kv_budget_bytes

GIB = 2**30


def test_utilization_of_the_device_minus_the_profiled_peak():
    # 140 GiB device, 0.9 of it = 126 GiB; weights + largest step peaked at 2 GiB
    assert kv_budget_bytes(140 * GIB, 137 * GIB, 2 * GIB, 0.9) == int(140 * GIB * 0.9) - 2 * GIB


def test_never_more_than_is_free_when_another_process_holds_memory():
    # another process holds 60 GiB: only 78 GiB are free, less than 0.9 x 140 - 2
    assert kv_budget_bytes(140 * GIB, 78 * GIB, 2 * GIB, 0.9) == 78 * GIB


def test_nothing_left_is_zero_not_negative():
    assert kv_budget_bytes(16 * GIB, 15 * GIB, 15 * GIB, 0.5) == 0
