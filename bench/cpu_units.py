"""Small, repeatable units of engine work: B sequences decoding, one N-token prefill.

The roofline rows of ``kvscope bench`` and the thread-policy A/B (bench/threads_ab.py)
time these. A unit keeps its engine between calls, so it can be called again and
again, interleaved with other settings: ``DecodeBatch.run(k)`` times k more decode
steps of the same B running sequences (their contexts grow by k), ``Prefill.run()``
prefills one fresh prompt in one step. Only the engine's public API is used
(add_request / step).

Timings per step: wall seconds (perf_counter), CPU seconds of the whole process (all
threads, so OpenMP's spin-waits count) and of the calling thread.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field


@dataclass
class UnitTiming:
    """What one call of a unit measured; written by that unit."""

    tokens: int  # tokens the timed steps computed (decode: one per sequence and step)
    wall_s: list[float] = field(default_factory=list)  # per step
    cpu_s: list[float] = field(default_factory=list)  # per step, whole process
    thread_cpu_s: list[float] = field(default_factory=list)  # per step, calling thread
    context_lens: list[int] | None = None  # decode: each step's context length per sequence

    @property
    def median_wall_s(self) -> float:
        return statistics.median(self.wall_s)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "wall_s": self.wall_s, "cpu_s": self.cpu_s,
                "thread_cpu_s": self.thread_cpu_s, "context_lens": self.context_lens}


def _timed_step(engine, timing: UnitTiming):
    t, c, tc = time.perf_counter(), time.process_time(), time.thread_time()
    outs = engine.step()
    timing.wall_s.append(time.perf_counter() - t)
    timing.cpu_s.append(time.process_time() - c)
    timing.thread_cpu_s.append(time.thread_time() - tc)
    return outs


def synthetic_prompt(vocab_size: int, length: int, seed: int) -> list[int]:
    """Seeded token ids, distinct per seed (no prefix-cache hits between prompts)."""
    rng = random.Random(seed)
    lo = min(1000, vocab_size // 2)  # past the special and byte tokens of most vocabularies
    return [rng.randrange(lo, vocab_size) for _ in range(length)]


def fitting_prompt_len(loaded, prompt_len: int, margin: int = 16) -> int:
    """``prompt_len``, or less when the model has fewer positions than it plus ``margin``
    (the tiny test models have 512; build_engine refuses a longer max_model_len)."""
    return max(1, min(prompt_len, loaded.spec.max_position_embeddings - margin))


def decode_max_tokens(batch: int, prompt_len: int, steps: int, step_budget: int = 512) -> int:
    """``max_tokens`` for a DecodeBatch that must time ``steps`` steps of all ``batch``
    sequences: the prompts prefill ``step_budget`` tokens a step (the engine's default
    chunk budget), so the first sequences decode while later ones still prefill, up to
    ceil(batch * prompt_len / step_budget) steps ahead of the last."""
    return steps + -(-batch * prompt_len // step_budget) + 2


class DecodeBatch:
    """``batch`` sequences of ``prompt_len``-token prompts, all decoding in one engine.

    Built once (prompts prefilled, every sequence past its first token); each ``run(k)``
    then times k steps in which every step decodes exactly one token per sequence (it
    raises if a step decoded fewer: a sequence that started early would finish first;
    size ``max_tokens`` with ``decode_max_tokens``).
    """

    def __init__(self, engine, vocab_size: int, batch: int, prompt_len: int = 64,
                 max_tokens: int = 1024, seed: int = 0) -> None:
        from engine import SamplingParams

        self.engine, self.batch = engine, batch
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for i in range(batch):
            engine.add_request(synthetic_prompt(vocab_size, prompt_len, seed * 10_000 + i), params,
                               request_id=f"decode{batch}-{i}")
        generated: dict[str, int] = {}
        while len(generated) < batch:  # until every sequence has its first token
            for out in engine.step():
                if out.outputs[0].token_ids:
                    generated[out.request_id] = len(out.outputs[0].token_ids)
        # the first sequences to finish prefilling decoded while the others prefilled;
        # every sequence decodes in each step until the one furthest ahead is done
        self.steps_left = max_tokens - max(generated.values())
        # every sequence holds its prompt and its first token; the next step writes that
        # token's K/V and attends over prompt_len + 1 positions
        self.context_len = prompt_len + 1

    def run(self, steps: int) -> UnitTiming:
        if steps > self.steps_left:
            raise ValueError(f"only {self.steps_left} decode steps left in this batch")
        timing = UnitTiming(tokens=steps * self.batch, context_lens=[])
        for _ in range(steps):
            timing.context_lens.append(self.context_len)
            outs = _timed_step(self.engine, timing)
            if len(outs) != self.batch:
                raise RuntimeError(f"a timed step decoded {len(outs)} of {self.batch} sequences")
            self.context_len += 1
        self.steps_left -= steps
        return timing


class Prefill:
    """One fresh ``prompt_len``-token prompt per call, prefilled in one engine step.

    The engine must take the whole prompt in one step (max_num_batched_tokens >=
    prompt_len) and should have prefix caching off; each call uses a new prompt anyway.
    """

    def __init__(self, engine, vocab_size: int, prompt_len: int = 512, seed: int = 1) -> None:
        self.engine, self.vocab_size, self.prompt_len = engine, vocab_size, prompt_len
        self.seed, self.calls = seed, 0

    def run(self) -> UnitTiming:
        from engine import SamplingParams

        self.calls += 1
        prompt = synthetic_prompt(self.vocab_size, self.prompt_len, self.seed * 100_000 + self.calls)
        self.engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
                                request_id=f"prefill-{self.seed}-{self.calls}")
        timing = UnitTiming(tokens=self.prompt_len)
        _timed_step(self.engine, timing)
        if self.engine.has_unfinished_requests():
            raise RuntimeError(f"a {self.prompt_len}-token prompt did not prefill in one step; "
                               "raise max_num_batched_tokens")
        return timing
