"""kvscope's engine. ``from engine import LLM, SamplingParams``.

The heavy parts (torch, the model) load lazily, so ``engine.core`` and
``engine.events`` stay importable without torch.
"""

from engine.core.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams"]


def __getattr__(name: str):
    if name in ("LLM", "LLMEngine", "RequestOutput", "CompletionOutput"):
        from engine.cpu_threads import set_default_wait_policy

        # an offline run, unless something decided first (engine.cli for serve); before
        # engine.llm imports torch, since libgomp reads the policy once, at load
        set_default_wait_policy("offline")
        from engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
