"""PolicyReplay: what each routing policy of ``kvscope simulate`` would have done with an
attached deployment's requests (issue 31's "is my router losing hits?", second half).

The routers are ``kvscope simulate``'s own (``engine.simulate.routers.ROUTERS``: round-robin,
least-loaded, llm-d's precise prefix scorer, GIE's approximate one, Dynamo's cost, the oracle),
shared, not copied. Each policy routes the same request stream to its own replayed fleet: one
``ReplayPod`` per attached pod, a block-hash LRU cache. A request's hit under a policy is the
run of its blocks, from the first, that the chosen replayed pod holds when it arrives; then the
pod caches the request's blocks and evicts past its capacity, and the router sees that pod's
store and removal events (``observe``), as from a real pod's KV events.

**The request stream, derived from the events** (what ``engine.attach.ledger`` reads as a new
request): a stored chain that starts a prompt (no parent) or branches below a cached block.
Its blocks are the prompt's full blocks as far as the pod announced them: the cached
ancestors (what the pod hit) and the stored ones (what it computed). Its arrival is the
batch's ts (the engine's clock). Its tokens are the blocks' token ids (a placeholder tier has
none: only the engine's pool, medium GPU or none, is replayed).

**What events cannot tell, and the assumption taken** (every figure is a bound of this):
- requests that stored nothing (the whole prompt hit) and a chain that extends a leaf (a
  later chunk of one prompt cannot be told from a new request) are not seen; the figures are
  over the requests seen, the same ones as the ledger's achieved and reachable hits;
- the partial last block of a prompt is never stored: hits are counted in full blocks;
- when a request ends is not in the events: a replayed pod's load (what least-loaded, the
  tie-breaks and Dynamo's in-flight blocks read) counts the requests routed to it in the
  last ``LOAD_WINDOW_S`` of the engine clock, and Dynamo is told a request finished when it
  leaves that window;
- a pod's pool size: its peak cached blocks once it has evicted (``FleetLedger._capacities``:
  the pool was full then); before its first eviction no bound (it never had to evict) but the
  whole fleet's (every pod's peak summed: a memory guard). The LRU frees a request's blocks
  tail first, as vLLM's free queue does;
- hashes are comparable across pods (one hash scheme and seed), as the reachable figure needs;
- a router sees a replayed pod's events at once (the real index lags a step).

The oracle reads each replayed pod's cache (``kv.pool.cached``, the shape a ``SimPod`` has);
its hit rate is the best any policy could do with the replayed caches, not the same figure
as the ledger's reachable one, which reads the real pods' caches.

Writer: the thread that folds the ledger (``FleetLedger.replay``); ``summary`` and ``series``
are read under the worker's lock.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from engine.simulate.routers import ROUTERS, Routed, Router
from engine.simulate.routers.base import consecutive

LOAD_WINDOW_S = 10.0  # a request counts as in flight this long after it arrived (engine clock)
POINT_EVERY_S = 1.0  # the series keeps one point per this much engine time
MAX_POINTS = 3600  # an hour of points; the oldest go
ENGINE_TIERS = (None, "GPU")  # the engine's own pool: the only tier a router's choice fills


class ReplayPod:
    """One pod of a policy's replayed fleet, in the shape the routers read of a ``SimPod``:
    ``load`` (running + waiting, here: requests of the last ``LOAD_WINDOW_S``) and
    ``kv.pool.cached`` (its cache: what only the oracle reads)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cached: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.capacity: int | None = None  # blocks; None: no bound known
        self.guard: int | None = None  # without a capacity, at most this many (the fleet's peaks)
        self.in_flight: deque[tuple[float, str]] = deque()  # (arrival ts, request id)
        self.requests = 0

    @property
    def kv(self) -> ReplayPod:
        return self

    @property
    def pool(self) -> ReplayPod:
        return self

    @property
    def load(self) -> int:
        return len(self.in_flight)

    def admit(self, request_id: str, ts: float, hashes: Sequence[str]) -> tuple[int, list[str], list[str]]:
        """(blocks hit, hashes stored, hashes evicted) for a request routed here."""
        hit = consecutive(hashes, self.cached)
        stored = [h for h in hashes if h not in self.cached]
        for h in reversed(hashes):  # the tail least recent: evicted first, as vLLM frees it
            self.cached[h] = None
            self.cached.move_to_end(h)
        removed = []
        bound = self.capacity if self.capacity is not None else self.guard
        if bound is not None:
            while len(self.cached) > bound:
                removed.append(self.cached.popitem(last=False)[0])
        self.in_flight.append((ts, request_id))
        self.requests += 1
        return hit, stored, removed

    def expire(self, now: float) -> list[str]:
        """The requests that left the load window at ``now`` (finished, as far as we know)."""
        out = []
        q = self.in_flight
        while q and q[0][0] <= now - LOAD_WINDOW_S:
            out.append(q.popleft()[1])
        return out


class _Policy:
    __slots__ = ("router", "pods", "hit_blocks")

    def __init__(self, router: Router, pods: list[ReplayPod]) -> None:
        self.router, self.pods, self.hit_blocks = router, pods, 0


class PolicyReplay:
    """Every policy of ``ROUTERS`` over the attached pods ``pods``, fed request by request."""

    def __init__(self, pods: Sequence[str], policies: Sequence[str] | None = None) -> None:
        names = list(policies) if policies is not None else list(ROUTERS)
        unknown = [n for n in names if n not in ROUTERS]
        if unknown:
            raise ValueError(f"unknown routing policy {', '.join(map(repr, unknown))} (known: {', '.join(ROUTERS)})")
        if not pods:
            raise ValueError("a policy replay needs at least one pod")
        self.pod_names = list(pods)
        self.policy_names = names
        self.policies: dict[str, _Policy] | None = None  # made at the first request (its block size)
        self.block_size: int | None = None
        self.requests = self.blocks = self.achieved_blocks = self.reachable_blocks = 0
        self.skipped_tiers = 0  # requests on an offload tier (not routed: a router fills the pool)
        self.points: deque[dict[str, Any]] = deque(maxlen=MAX_POINTS)
        self._last_ts: float | None = None
        self._point_from = 0.0  # the engine ts the latest point's interval began at

    def _start(self, block_size: int) -> dict[str, _Policy]:
        self.block_size = block_size
        n = len(self.pod_names)
        return {name: _Policy(ROUTERS[name](n, block_size), [ReplayPod(p) for p in self.pod_names])
                for name in self.policy_names}

    def request(self, origin: str, ts: float, medium: str | None, chain: Sequence[str],
                token_ids: Sequence[int], block_size: int, achieved: int, reachable: int,
                capacities: dict[str, int | None], fleet_blocks: int = 0) -> None:
        """A request seen on pod ``origin``: its full blocks' hashes ``chain`` and tokens, what
        its pod hit (``achieved`` blocks) and the most any real pod held (``reachable``).
        ``capacities``: each pod's pool as known (None: no bound known); ``fleet_blocks``: the
        pods' peaks summed, which a pod without a known bound never holds more than (a memory
        guard: a replayed pod would otherwise keep every hash ever routed to it)."""
        if medium not in ENGINE_TIERS:
            self.skipped_tiers += 1
            return
        if self.policies is None:
            self.policies = self._start(block_size)
        elif block_size != self.block_size:
            return  # another block size (a hybrid model's other group): not comparable
        if self._last_ts is not None and ts < self._last_ts:
            ts = self._last_ts  # pods' clocks differ a little: time never goes back here
        self._last_ts = ts
        hashes = tuple(chain)
        tokens = list(token_ids)
        if len(tokens) != len(hashes) * block_size:  # tokens unknown: a stand-in per block
            tokens = [t for h in hashes for t in (zlib.crc32(h.encode()),) * block_size]
        rid = f"{origin}#{self.requests}"
        self.requests += 1
        self.blocks += len(hashes)
        self.achieved_blocks += achieved
        self.reachable_blocks += reachable
        req = Routed(rid, tokens, hashes)
        for pol in self.policies.values():
            for k, pod in enumerate(pol.pods):
                pod.capacity = capacities.get(pod.name)
                pod.guard = max(fleet_blocks, len(hashes))
                for done in pod.expire(ts):
                    pol.router.finished(k, done)
            k = pol.router.route(req, pol.pods)
            hit, stored, removed = pol.pods[k].admit(rid, ts, hashes)
            pol.hit_blocks += hit
            pol.router.observe(k, stored, removed)
        self._point(ts)

    def _point(self, ts: float) -> None:
        point = {"ts": ts, "requests": self.requests, "blocks": self.blocks,
                 "achieved_blocks": self.achieved_blocks, "reachable_blocks": self.reachable_blocks,
                 "hit_blocks": {n: p.hit_blocks for n, p in (self.policies or {}).items()}}
        if self.points and ts - self._point_from < POINT_EVERY_S:
            self.points[-1] = point  # the latest point moves until POINT_EVERY_S has passed
        else:
            self.points.append(point)
            self._point_from = ts

    def summary(self, models: bool = True) -> dict[str, Any]:
        """The totals: per policy its hit blocks and rate, beside achieved and reachable; with
        ``models``, what real router each policy models (static: steps leave it out)."""
        n = self.blocks

        def rate(k: int) -> float | None:
            return k / n if n else None

        policies = {}
        for name in self.policy_names:
            pol = (self.policies or {}).get(name)
            hit = 0 if pol is None else pol.hit_blocks
            policies[name] = {"hit_blocks": hit, "hit_rate": rate(hit),
                              "requests_per_pod": {p.name: p.requests for p in pol.pods} if pol else
                              {p: 0 for p in self.pod_names}}
            if models:
                policies[name]["models"] = ROUTERS[name].models
        first = next(iter((self.policies or {}).values()), None)
        return {"requests": self.requests, "blocks": n, "block_size": self.block_size,
                "achieved_blocks": self.achieved_blocks, "achieved_hit_rate": rate(self.achieved_blocks),
                "reachable_blocks": self.reachable_blocks, "reachable_hit_rate": rate(self.reachable_blocks),
                "policies": policies, "pods": list(self.pod_names),
                "capacity_blocks": {p.name: p.capacity for p in first.pods} if first else
                {p: None for p in self.pod_names},
                "offload_tier_requests_skipped": self.skipped_tiers, "load_window_s": LOAD_WINDOW_S}

    def series(self) -> list[dict[str, Any]]:
        """Cumulative figures over time, at most one point per ``POINT_EVERY_S`` (engine clock)."""
        return [dict(p, hit_blocks=dict(p["hit_blocks"])) for p in self.points]


__all__ = ["LOAD_WINDOW_S", "PolicyReplay", "ReplayPod"]
