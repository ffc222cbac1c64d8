"""A model-free driver for the scheduler: 'samples' deterministic fake tokens."""

from __future__ import annotations

from engine.core import (
    CacheConfig, ModelRunnerOutput, Request, SampledToken, SamplingParams, Scheduler, SchedulerConfig,
)


def make_scheduler(block_size=4, num_blocks=16, max_model_len=64, budget=64, max_num_seqs=8,
                   chunked=True, prefix=True, threshold=0, n_sharing="cow", policy="fcfs",
                   fair_ratio=0) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_model_len=max_model_len, max_num_batched_tokens=budget,
                        max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked,
                        long_prefill_token_threshold=threshold, n_sharing=n_sharing, policy=policy,
                        fair_ratio=fair_ratio),
        CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix),
    )


def req(rid: str, tokens, max_tokens=4, n=1, eos=(), **kw) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, n=n, temperature=0, **kw),
                   eos_token_ids=tuple(eos))


def fake_token(request_id: str, k: int, position: int) -> int:
    """Deterministic token for sample k of a request at a position (vocab 1000..1999).
    ``request_id`` is the user's id (a fork's parent), so samples differ only by k."""
    return 1000 + (sum(map(ord, request_id)) * 31 + k * 7 + position * 13) % 1000


def tokens(mapping: dict[str, int]) -> ModelRunnerOutput:
    """A runner output sampling ``mapping[rid]`` for each id."""
    return ModelRunnerOutput({rid: SampledToken(t) for rid, t in mapping.items()})


def step(s: Scheduler):
    """One schedule → update round; returns (output, new fork children, finished requests)."""
    out = s.schedule()
    known = dict(s.requests)
    sampled = {}
    for x in out.scheduled:
        r = s.requests[x.request_id]
        user_id = r.parent_id or r.request_id
        for k, sid in enumerate(x.sample_ids):
            # sample k's own stream in both n_sharing modes: a fork point's k-th id, or the
            # sample index of a request that samples for itself (a child, forked or not)
            sampled[sid] = fake_token(user_id, k if k else r.sample_index, x.seq_len)
    core = s.update_from_output(out, tokens(sampled))
    for o in core.outputs:  # a fork child finished in its first step is gone already
        known.setdefault(o.request_id, s.requests.get(o.request_id))
    children = [known[o.request_id] for o in core.outputs
                if o.sample_index > 0 and o.request_id not in {x.request_id for x in out.scheduled}]
    finished = [known[o.request_id] for o in core.outputs if o.finish_reason is not None]
    return out, children, finished


def run_all(s: Scheduler, max_steps=1000):
    outs = []
    for _ in range(max_steps):
        if not s.has_unfinished_requests():
            return outs
        outs.append(step(s)[0])
    raise AssertionError("requests did not finish")
