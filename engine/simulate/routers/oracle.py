"""The oracle: it reads every pod's true cache (no real router can) and sends the request
where the longest prefix of it is cached now; ties to the least loaded pod. Its hit rate
is the reachable one a router with perfect information would get."""

from __future__ import annotations

from engine.simulate.routers.base import Router, best, consecutive


class Oracle(Router):
    name = "oracle"
    models = "oracle: every pod's true cache (an upper bound, no real router)"

    def route(self, req, pods) -> int:
        return best([consecutive(req.block_hashes, p.kv.pool.cached) for p in pods], pods)
