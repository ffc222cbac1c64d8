"""FleetLedger: an attached run's fold plus what the fold forgets: removals, churn, oddities.

Past 300 lines on purpose: one fold of the ``kv_*`` events, and each figure below reads
state another one writes (a removal feeds churn, the miss explainer and placement);
the per-policy replay lives apart (``engine.attach.policy_replay``).

``HashCacheState`` keeps what each pod has cached now. An operator also asks what left
and when ("was my prefix evicted, or never there?"), how fast blocks churn, and how
odd the stream is. The ledger folds the same ``kv_*`` events (the attach worker's live
steps, or a stored run's records) with a ``HashCacheState`` inside and keeps, per pod:

- **removal memory**: each hash that left the cache (medium, hash) → ``Removal``
  (engine ts, step, the block's parent and tokens, why: ``evicted`` by a
  ``BlockRemoved`` of its last copy, ``cleared`` by ``AllBlocksCleared``, ``restart``
  by a publisher restart). A hash stored again is forgotten. Bounded
  (``MAX_REMOVALS`` per pod, the oldest go). The prefix locator reads it
  (``engine.attach.locator``): a chain that breaks at an evicted block says when.
- **churn**: blocks evicted (last copy removed, clears and restarts apart), of those
  evicted before any certain reuse (the fold's ``reuses`` was 0: no second store of
  the hash, no branch below it; hits that store nothing are invisible, so this share
  is an upper bound), and the engine-ts of each eviction in the last
  ``CHURN_WINDOW_S`` (blocks evicted per minute).
- **placement** (reachable against achieved, issue 31's "is my router losing hits?"): for
  each stored chain that is a new request's (it starts a prompt, or branches below a cached
  block), the prompt blocks known (the cached ancestors and the stored ones), the blocks the
  pod already held (achieved: its hit) and the most any pod held at that moment, by hash
  (reachable: the best placement). A bound, from the events alone: a request that stored
  nothing (all of it hit) and a chain extending a leaf (the same request's next chunk cannot
  be told from a new request) are not seen; the hashes must be comparable across pods (one
  hash scheme and seed, as vLLM's sha256 default and kvscope have). ``/metrics`` give the
  engines' real hit rates beside it.
- **miss causes** (issue 31's miss explainer, per pod): each such request's missed blocks
  (the stored ones: a request stores what it computed) get one cause, the locator's rule
  (``engine.attach.locator``): a chain is reused only up to its first missing block, so every
  block from there on misses for that block's reason: ``evicted`` / ``cleared`` / ``restart``
  (the removal memory has its hash), ``other_keys`` (a cached sibling holds its very tokens
  under another hash), ``diverged`` (the pod caches another continuation of the prefix),
  ``last_token`` (the block is cached already: the engine recomputed the block holding the
  prompt's last token, vLLM's second copy) or ``never_stored``. In tokens (blocks x block
  size), so per pod they add up to ``(placed_blocks - achieved_blocks) x block size``. The
  partial last block and a prompt under one block are never stored, so events cannot show
  them; the locator's probes (``add_probe``) can, and are summed apart.
- **capacity**: the most blocks the pod held at once (``peak_blocks``), a lower bound of its
  pool; once the pod has evicted, its pool was full then, so it is the pool's size as far as
  events tell (``engine.attach.policy_replay`` sizes its replayed pods by it).
- **event oddities** (the event side of the index fidelity monitor,
  ``engine.attach.fidelity``): placeholder stores (no tokens: an offload tier's hash),
  duplicate stores (a hash stored while cached: vLLM's recomputed copy), removals of
  hashes never stored (from the fold), clears, restarts, holes.

Writer: the thread that folds (the attach worker, or the dashboard's script run).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.events.folds.hash_cache_state import HashCacheState
from engine.events.schema.types import Event, KVAllCleared, KVBlockRemoved, KVBlockStored, KVSegment

MAX_CHAIN_WALK = 4096  # ancestors walked to rebuild a stored chain's prefix (a 64k-token prompt of 16)
MAX_REMOVALS = 50_000  # per pod: (medium, hash) keys with a few fields, ~10 MB at most
CHURN_WINDOW_S = 60.0  # "evicted per minute" counts the evictions of the last minute (engine ts)
EVICTED, CLEARED, RESTART = "evicted", "cleared", "restart"
DIVERGED, OTHER_KEYS, NEVER_STORED, LAST_TOKEN = "diverged", "other_keys", "never_stored", "last_token"


@dataclass(frozen=True, slots=True)
class Removal:
    """A block that left a pod's cache."""

    hash: str
    medium: str | None
    parent: str | None
    token_ids: tuple[int, ...]
    ts: float  # the removing batch's ts (the engine's clock)
    step: int  # the attached run's step
    why: str  # EVICTED | CLEARED | RESTART
    reuses: int  # certain reuses while it was cached


class PodLedger:
    __slots__ = ("placed_chains", "placed_blocks", "achieved_blocks", "reachable_blocks", "miss_tokens",
                 "probe_misses", "probes", "probe_prompt_tokens", "probe_hit_tokens", "roots", "peak_blocks",
                 "pod", "removals", "by_tokens", "mediums", "evicted", "evicted_unreused", "recent",
                 "placeholder_stores", "duplicate_stores", "stored_again_after_removal", "last_ts")

    def __init__(self, pod: str) -> None:
        self.pod = pod
        self.removals: OrderedDict[tuple[str | None, str], Removal] = OrderedDict()
        # (medium, parent, tokens) -> hash: a removed block found by its tokens (token-id pods)
        self.by_tokens: dict[tuple[str | None, str | None, tuple[int, ...]], str] = {}
        self.mediums: set[str | None] = set()  # every medium a removal was remembered in
        self.evicted = self.evicted_unreused = 0
        # engine ts of the blocks stored / removed / evicted in the last CHURN_WINDOW_S
        self.recent: dict[str, deque[float]] = {"stored": deque(), "removed": deque(), "evicted": deque()}
        self.placeholder_stores = self.duplicate_stores = self.stored_again_after_removal = 0
        self.last_ts: float | None = None
        self.placed_chains = self.placed_blocks = self.achieved_blocks = self.reachable_blocks = 0
        self.miss_tokens: dict[str, int] = {}  # cause -> missed tokens of the requests seen (events)
        self.probe_misses: dict[str, int] = {}  # cause -> missed tokens of the locator's probes
        self.probes = self.probe_prompt_tokens = self.probe_hit_tokens = 0
        # medium -> a root block's tokens -> its hashes: the roots cached now (parent None),
        # to tell a first block's miss (diverged, other keys) without walking the pool
        self.roots: dict[str | None, dict[tuple[int, ...], set[str]]] = {}
        self.peak_blocks = 0  # the most blocks held at once since the attach

    def misses(self) -> dict[str, Any]:
        """The miss explainer's sums: the requests seen (events) and the locator's probes."""
        return {"miss_tokens": dict(self.miss_tokens), "missed_tokens": sum(self.miss_tokens.values()),
                "probes": self.probes, "probe_prompt_tokens": self.probe_prompt_tokens,
                "probe_hit_tokens": self.probe_hit_tokens, "probe_misses": dict(self.probe_misses)}

    def add_probe(self, prompt_tokens: int, hit_tokens: int, misses: dict[str, int]) -> None:
        """A locator answer for this pod (its best tier's ``misses()``, which add up to
        ``prompt_tokens - hit_tokens``)."""
        self.probes += 1
        self.probe_prompt_tokens += prompt_tokens
        self.probe_hit_tokens += hit_tokens
        for cause, n in misses.items():
            self.probe_misses[cause] = self.probe_misses.get(cause, 0) + n

    def _root_gone(self, medium: str | None, block_hash: str, token_ids: tuple[int, ...]) -> None:
        by_tokens = self.roots.get(medium, {})
        hs = by_tokens.get(token_ids)
        if hs is not None:
            hs.discard(block_hash)
            if not hs:
                del by_tokens[token_ids]
                if not by_tokens:
                    del self.roots[medium]

    def placement(self) -> dict[str, Any]:
        """The requests seen starting or branching here: prompt blocks, the blocks this pod
        already held (achieved), the most any pod held (reachable), and the two as rates."""
        n = self.placed_blocks
        return {"placed_chains": self.placed_chains, "placed_blocks": n,
                "achieved_blocks": self.achieved_blocks, "reachable_blocks": self.reachable_blocks,
                "achieved_hit_rate": self.achieved_blocks / n if n else None,
                "reachable_hit_rate": self.reachable_blocks / n if n else None}

    def removal(self, medium: str | None, block_hash: str) -> Removal | None:
        return self.removals.get((medium, block_hash))

    def removal_by_tokens(self, medium: str | None, parent: str | None,
                          token_ids: tuple[int, ...]) -> Removal | None:
        h = self.by_tokens.get((medium, parent, token_ids))
        return None if h is None else self.removals.get((medium, h))

    def _remember(self, r: Removal) -> None:
        key = (r.medium, r.hash)
        old = self.removals.pop(key, None)
        if old is not None:
            self.by_tokens.pop((old.medium, old.parent, old.token_ids), None)
        self.removals[key] = r
        self.mediums.add(r.medium)
        if r.token_ids:
            self.by_tokens[(r.medium, r.parent, r.token_ids)] = r.hash
        while len(self.removals) > MAX_REMOVALS:
            _, gone = self.removals.popitem(last=False)
            if self.by_tokens.get((gone.medium, gone.parent, gone.token_ids)) == gone.hash:
                del self.by_tokens[(gone.medium, gone.parent, gone.token_ids)]

    def _forget(self, medium: str | None, block_hash: str) -> bool:
        r = self.removals.pop((medium, block_hash), None)
        if r is None:
            return False
        if self.by_tokens.get((r.medium, r.parent, r.token_ids)) == r.hash:
            del self.by_tokens[(r.medium, r.parent, r.token_ids)]
        return True

    def _count(self, kind: str, ts: float, n: int = 1) -> None:
        q = self.recent[kind]
        q.extend([ts] * n)
        while q and q[0] <= ts - CHURN_WINDOW_S:
            q.popleft()

    def per_min(self, kind: str, now_ts: float | None = None) -> float:
        """Blocks ``kind`` ("stored", "removed", "evicted") in the ``CHURN_WINDOW_S`` before
        ``now_ts`` (default, and never earlier than: the pod's latest ts), per minute.
        Amortized O(1): what fell out of the window is dropped (the worker asks every step)."""
        now = self.last_ts if now_ts is None else now_ts
        if now is None:
            return 0.0
        q = self.recent[kind]
        while q and q[0] <= now - CHURN_WINDOW_S:
            q.popleft()
        return len(q) * 60.0 / CHURN_WINDOW_S

    def churn(self) -> dict[str, Any]:
        return {"evicted_blocks": self.evicted,
                "evicted_before_reuse": self.evicted_unreused,
                "evicted_before_reuse_share": (self.evicted_unreused / self.evicted
                                               if self.evicted else None),
                "evicted_per_min": self.per_min("evicted"),
                "stored_per_min": self.per_min("stored"), "removed_per_min": self.per_min("removed"),
                "recomputed_after_removal": self.stored_again_after_removal}


class FleetLedger:
    """Fold an attached run's events; ``state`` is the cache, ``pods`` the ledgers."""

    def __init__(self, state: HashCacheState | None = None, replay: Any = None) -> None:
        self.state = state if state is not None else HashCacheState()
        self.pods: dict[str, PodLedger] = {}
        # engine.attach.policy_replay.PolicyReplay: each request seen, routed by every policy
        self.replay = replay

    def pod(self, name: str) -> PodLedger:
        p = self.pods.get(name)
        if p is None:
            p = self.pods[name] = PodLedger(name)
        return p

    def apply_step(self, record: Any) -> None:
        self.apply_events(record.events, step=record.step)

    def apply_events(self, events: Iterable[Event], step: int | None = None) -> None:
        for e in events:
            self._before(e, e.step if step is None else step)
            self.state.apply_event(e)
            if isinstance(e, KVBlockStored):
                p = self.state.pods[e.pod]
                led = self.pod(e.pod)
                led.peak_blocks = max(led.peak_blocks, len(p.blocks))
        if step is not None:
            self.state.step = step

    # ---- what the fold is about to forget ------------------------------------------------

    def _before(self, e: Event, step: int) -> None:
        if isinstance(e, KVBlockStored):
            led = self.pod(e.pod)
            led.last_ts = _later(led.last_ts, e.ts)
            if e.is_placeholder:
                led.placeholder_stores += len(e.block_hashes)
            cached = self.state.pods.get(e.pod)
            if not e.is_placeholder and e.block_hashes:
                self._placement(led, e)  # before the removal memory forgets what is stored again
            new = 0
            for h in e.block_hashes:
                if cached is not None and (e.medium, h) in cached.blocks:
                    led.duplicate_stores += 1
                    continue
                new += 1
                if led._forget(e.medium, h):
                    led.stored_again_after_removal += 1
            led._count("stored", e.ts, new)
            if e.parent_hash is None and e.block_hashes and not e.is_placeholder and (
                    cached is None or (e.medium, e.block_hashes[0]) not in cached.blocks):
                led.roots.setdefault(e.medium, {}).setdefault(e.block_tokens(0), set()).add(e.block_hashes[0])
        elif isinstance(e, KVBlockRemoved):
            led = self.pod(e.pod)
            led.last_ts = _later(led.last_ts, e.ts)
            p = self.state.pods.get(e.pod)
            if p is None:
                return
            pending: dict[tuple[str | None, str], int] = {}  # copies this event already took
            for h in e.block_hashes:
                key = (e.medium, h)
                if key not in p.blocks and e.medium is None:  # the fold's own medium rule
                    key = next(((m, h) for m in p.mediums if (m, h) in p.blocks), key)
                b = p.blocks.get(key)
                if b is None:
                    continue
                pending[key] = pending.get(key, 0) + 1
                if pending[key] > b.copies:
                    continue  # more removals than copies: the fold counts it as unknown
                led._count("removed", e.ts)
                if b.copies - pending[key] == 0:  # its last copy: the block leaves
                    if b.parent is None:
                        led._root_gone(b.medium, b.hash, b.token_ids)
                    led.evicted += 1
                    led.evicted_unreused += b.reuses == 0
                    led._count("evicted", e.ts)
                    led._remember(Removal(b.hash, b.medium, b.parent, b.token_ids, e.ts, step,
                                          EVICTED, b.reuses))
        elif isinstance(e, KVAllCleared):
            self._all_left(e.pod, e.ts, step, CLEARED)
        elif isinstance(e, KVSegment) and e.reason == "restart":
            p = self.state.pods.get(e.pod)
            self._all_left(e.pod, p.last_ts if p is not None and p.last_ts is not None else 0.0,
                           step, RESTART)

    def _placement(self, led: PodLedger, e: KVBlockStored) -> None:
        """Achieved against reachable, for a stored chain that is a new request's: one that
        starts a prompt (no parent) or branches below a cached block. A chain extending a
        leaf may be the same request's next chunk or decode block, so it is left out."""
        p = self.state.pods.get(e.pod)
        parent = e.parent_hash
        ancestors: list[str] = []
        if parent is not None:
            if p is None or (e.medium, parent) not in p.blocks:
                return  # the prefix is not known here (joined late, a hole): no verdict
            kids = p.children.get((e.medium, parent), ())
            if not any(k != e.block_hashes[0] for k in kids):
                return  # extends a leaf (or re-stores its only child)
            key: tuple[str | None, str] | None = (e.medium, parent)
            while key is not None and key in p.blocks and len(ancestors) < MAX_CHAIN_WALK:
                ancestors.append(key[1])
                up = p.blocks[key].parent
                key = None if up is None else (e.medium, up)
            if key is not None:
                return  # the chain's root is not cached here: its full prefix is unknown
            ancestors.reverse()
        chain = ancestors + list(e.block_hashes)
        reachable = 0
        for q in self.state.pods.values():
            n = 0
            while n < len(chain) and (e.medium, chain[n]) in q.blocks:
                n += 1
            reachable = max(reachable, n)
        achieved = len(ancestors)  # the prefix the pod already held: its hit
        led.placed_chains += 1
        led.placed_blocks += len(chain)
        led.achieved_blocks += achieved
        led.reachable_blocks += max(reachable, achieved)
        cause = self._miss_cause(led, e)
        led.miss_tokens[cause] = led.miss_tokens.get(cause, 0) + len(e.block_hashes) * e.block_size
        if self.replay is not None:
            tokens = [t for key in ((e.medium, h) for h in ancestors) for t in p.blocks[key].token_ids] \
                if p is not None else []
            self.replay.request(e.pod, e.ts, e.medium, chain, tokens + list(e.token_ids), e.block_size,
                                achieved, max(reachable, achieved), self._capacities(),
                                sum(x.peak_blocks for x in self.pods.values()))

    def _capacities(self) -> dict[str, int | None]:
        """Each pod's pool in blocks as the events tell it: its peak once it has evicted
        (the pool was full then), else unknown (None: it never had to evict)."""
        return {name: (led.peak_blocks if led.evicted else None) for name, led in self.pods.items()}

    def _miss_cause(self, led: PodLedger, e: KVBlockStored) -> str:
        """Why the chain's first stored block missed on its pod, before the fold applies it
        (the locator's reasons, ``engine.attach.locator._why``, from the events alone)."""
        h0, want = e.block_hashes[0], e.block_tokens(0)
        p = self.state.pods.get(e.pod)
        if p is not None and (e.medium, h0) in p.blocks:
            return LAST_TOKEN  # cached already: a recomputed copy of the prompt's last block
        gone = led.removal(e.medium, h0)
        if gone is not None:
            return gone.why
        if e.parent_hash is None:
            roots = led.roots.get(e.medium, {})
            if any(h != h0 for h in roots.get(want, ())):
                return OTHER_KEYS
            return DIVERGED if roots else NEVER_STORED
        kids = () if p is None else p.children.get((e.medium, e.parent_hash), ())
        siblings = [p.blocks[(e.medium, k)] for k in kids if k != h0]
        if any(b.token_ids == want for b in siblings):
            return OTHER_KEYS
        return DIVERGED if any(b.token_ids for b in siblings) else NEVER_STORED

    def _all_left(self, pod: str, ts: float, step: int, why: str) -> None:
        led = self.pod(pod)
        p = self.state.pods.get(pod)
        if p is None:
            return
        for b in p.blocks.values():
            led._remember(Removal(b.hash, b.medium, b.parent, b.token_ids, ts, step, why, b.reuses))
        led.roots.clear()


def _later(a: float | None, b: float) -> float:
    return b if a is None or b > a else a
