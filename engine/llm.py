"""The user-facing API, shaped like vLLM's: ``LLM``, ``SamplingParams``, ``RequestOutput``.

    from engine import LLM, SamplingParams
    llm = LLM()  # SmolLM2-135M-Instruct on the CPU
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=20))
    print(out[0].outputs[0].text)
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import SamplingParams
from engine.kv_events.config import KVEventsConfig
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"]


class LLM:
    """Offline batch generation over one engine.

    ``kv_events_config`` (a KVEventsConfig, a dict or vLLM's JSON) publishes the KV
    cache as vLLM-format events; ``close()`` (or ``with LLM(...) as llm``) stops it.
    """

    def __init__(self, model: str = DEFAULT_MODEL, kv_events_config: KVEventsConfig | dict | str | None = None,
                 **kwargs) -> None:
        from engine.cpu_threads import set_default_wait_policy

        # before the first import of torch, which engine.engine_core.startup makes (libgomp reads the
        # wait policy once, when torch loads it); a no-op when torch is already loaded
        set_default_wait_policy()
        from engine.llm_engine import build_engine

        self.engine = build_engine(EngineConfig(model=model, kv_events_config=KVEventsConfig.coerce(kv_events_config),
                                                **kwargs))

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt (strings or token-id lists); outputs keep prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run([{"prompt": p} for p in prompts], sampling_params, use_tqdm)

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """One conversation (a list of {role, content}) or a list of conversations."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        return self._run([{"messages": c} for c in convs], sampling_params, use_tqdm)

    def _run(self, items: list[dict], params, use_tqdm: bool) -> list[RequestOutput]:
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(items)
        if len(params) != len(items):
            raise ValueError(f"{len(params)} SamplingParams for {len(items)} prompts")
        eng = self.engine
        ids = [eng.add_request(params=p, **item) for item, p in zip(items, params)]
        done: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="generate", unit="req")
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    done[out.request_id] = out
                    if bar:
                        bar.update(1)
        if bar:
            bar.close()
        return [done[i] for i in ids]

    def stats(self) -> dict:
        return self.engine.stats()

    def reset_prefix_cache(self) -> int:
        return self.engine.reset_prefix_cache()
