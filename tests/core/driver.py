"""A model-free driver for the scheduler: 'samples' deterministic fake tokens."""

from __future__ import annotations

from engine.core import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig


def make_scheduler(block_size=4, num_blocks=16, max_model_len=64, budget=64, max_num_seqs=8,
                   chunked=True, prefix=True, threshold=0) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_model_len=max_model_len, max_num_batched_tokens=budget,
                        max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked,
                        long_prefill_token_threshold=threshold),
        CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix),
    )


def req(rid: str, tokens, max_tokens=4, n=1, eos=(), **kw) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, n=n, temperature=0, **kw),
                   eos_token_ids=tuple(eos))


def fake_token(request_id: str, k: int, position: int) -> int:
    """Deterministic token for sample k of a request at a position (vocab 1000..1999)."""
    return 1000 + (sum(map(ord, request_id.split("#")[0])) * 31 + k * 7 + position * 13) % 1000


def step(s: Scheduler):
    """One schedule → update round; returns (output, children, finished)."""
    out = s.schedule()
    sampled = {x.request_id: [fake_token(x.request_id, k, x.seq_len) for k in range(x.num_samples)]
               for x in out.scheduled}
    children, finished = s.update_from_output(out, sampled)
    s.end_step()
    return out, children, finished


def run_all(s: Scheduler, max_steps=1000):
    outs = []
    for _ in range(max_steps):
        if not s.has_unfinished_requests():
            return outs
        outs.append(step(s)[0])
    raise AssertionError("requests did not finish")
