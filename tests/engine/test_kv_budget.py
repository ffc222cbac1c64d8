"""The CUDA KV budget arithmetic (the profile itself needs a GPU: bench/gpu_check.sh)."""

from engine.engine_core.startup import kv_budget_bytes

GIB = 2**30


def test_utilization_of_the_device_minus_the_profiled_peak():
    # 140 GiB device, 0.9 of it = 126 GiB; weights + largest step peaked at 2 GiB
    assert kv_budget_bytes(140 * GIB, 137 * GIB, 2 * GIB, 0.9) == int(140 * GIB * 0.9) - 2 * GIB


def test_never_more_than_is_free_when_another_process_holds_memory():
    # another process holds 60 GiB: only 78 GiB are free, less than 0.9 x 140 - 2
    assert kv_budget_bytes(140 * GIB, 78 * GIB, 2 * GIB, 0.9) == 78 * GIB


def test_nothing_left_is_zero_not_negative():
    assert kv_budget_bytes(16 * GIB, 15 * GIB, 15 * GIB, 0.5) == 0


def test_cuda_profile_plumbing_runs_on_cpu(monkeypatch, tiny_llama):
    # The profile step itself (scheduler output, runner, sampling) with torch.cuda's
    # memory calls stubbed: what is left for a GPU is only the numbers.
    import torch

    from engine.config import EngineConfig
    from engine.core import SchedulerConfig
    from engine.model.loader import load_model
    from engine.engine_core.startup import _profile_cuda_blocks

    calls = []
    for name in ("empty_cache", "reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda name=name: calls.append(name))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 2 * GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (137 * GIB, 140 * GIB))
    loaded = load_model(tiny_llama)
    cfg = EngineConfig(model=tiny_llama, attention_backend="torch")
    sched = SchedulerConfig(max_model_len=512, max_num_batched_tokens=100)
    blocks = _profile_cuda_blocks(cfg, loaded, 4096, sched, 16)
    assert blocks == (int(140 * GIB * 0.9) - 2 * GIB) // 4096
    assert calls.index("reset_peak_memory_stats") < calls.index("synchronize")
