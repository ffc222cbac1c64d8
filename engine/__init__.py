"""kvscope's engine. ``from engine import LLM, SamplingParams``.

The heavy parts (torch, the model) load lazily, so ``engine.core`` and
``engine.events`` stay importable without torch.
"""

from engine.cpu_threads import set_default_wait_policy

set_default_wait_policy()  # must run before anything imports torch (libgomp reads it once)

from engine.core.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams"]


def __getattr__(name: str):
    if name in ("LLM", "LLMEngine", "RequestOutput", "CompletionOutput"):
        from engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
