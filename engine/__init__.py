"""kvscope's engine. ``from engine import LLM, SamplingParams``.

The heavy parts (torch, the model) load lazily, so ``engine.core`` and
``engine.events`` stay importable without torch. Importing it changes nothing, not
even the environment: the OpenMP wait policy is set by an explicit call
(``engine.cpu_threads.set_default_wait_policy``) in the commands that run torch.
"""

from engine.core.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams"]


def __getattr__(name: str):
    if name in ("LLM", "LLMEngine", "RequestOutput", "CompletionOutput"):
        from engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
