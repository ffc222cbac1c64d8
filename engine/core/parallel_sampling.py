"""Parallel sampling as vLLM v1 does it: ``n > 1`` fanned out into n child requests.

With ``n_sharing="prefix_cache"`` the scheduler enters a request with ``n > 1`` as ``n``
separate requests (vLLM v1's ``ParentRequest`` in ``vllm/v1/engine/parallel_sampling.py``
makes ``n`` child requests with ``n = 1`` and seeds ``seed + index``). Nothing forks
and nothing is copied: the children share the prompt's full blocks only because the
first one's blocks are hashed when its step is scheduled and the others hit them in
the prefix cache; each child computes the prompt's partial last block (and the last
prompt token's logits) itself, in a block of its own. Without prefix caching the
children share nothing.

The samples keep kvscope's naming in both modes, so runs compare line by line: sample
0 keeps the user's request id, sample k is ``child_request_id(id, k)`` with
``parent_id`` set (the output processor groups them into one ``RequestOutput``), and
sample k's seed is the same in both modes (``Request.child_seed``).
"""

from __future__ import annotations

import dataclasses

from engine.core.request import Request


def fan_out(req: Request) -> list[Request]:
    """``req`` as its ``n`` single-sample requests: ``req`` itself (sample 0) first.

    Writer's call (the Scheduler's, at admission, before any token is computed): it
    sets ``req.params.n`` to 1 in place, as every child's is (the user's ``n`` stays
    with the output processor's request state)."""
    n = req.params.n
    assert n > 1 and req.num_computed_tokens == 0 and req.num_output_tokens == 0, req
    req.params = dataclasses.replace(req.params, n=1)
    return [req] + [req.fork(k) for k in range(1, n)]
