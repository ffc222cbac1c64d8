"""The prefix locator: which pod holds a prompt's prefix, on which tier, and where the chain breaks.

For each pod of an attached run and each tier (medium: GPU, CPU, CPU_PINNED, DISK, ...)
it holds blocks in, the prompt's longest run of leading full blocks cached there
(``engine.attach.prefix_match``: by hash where kvscope reproduces the pod's hashes, else
by the token ids ``BlockStored`` carries; a tier of placeholders, which carry no tokens, is
walked by the hashes another tier's token walk found), and the first block that is not
there, with why (``ChainBreak.reason``):

- ``evicted`` / ``cleared`` / ``restart``: the block was cached and left at ``ts`` (a
  ``BlockRemoved`` of its last copy, ``AllBlocksCleared``, a publisher restart), from
  the removal memory of ``engine.attach.ledger``;
- ``diverged``: the pod caches a different continuation of the prefix; ``token`` is
  the first prompt token that differs from the closest one;
- ``other_keys``: the pod caches these very tokens after the prefix under another
  hash (a LoRA adapter, a cache salt, multimodal extra keys, another hash seed);
- ``never_stored``: nothing on the tier continues the prefix, and no removal of it was
  seen since the attach (a hole in the stream may hide one: ``incomplete`` says so);
- ``partial_block`` / ``below_block`` / ``whole_prompt``: every full block of the
  prompt is cached; the rest is a partial block (engines cache full blocks only), the
  prompt is shorter than one block (vLLM #54607: a 0% hit rate that was right), or
  nothing is left (the engine still recomputes the last token).

``misses`` gives every prompt token that would miss one cause (the miss explainer, per prompt):
``last_token``, the break's reason for the full blocks from the break on, ``partial_block`` or
``below_block`` for the tokens that fill no block; they add up to the prompt's tokens less
``hit_tokens``.

``cached_tokens`` is the cached prefix (``cached_blocks`` x block size); ``hit_tokens`` is
what the engine would take from it if the prompt came now: never the last prompt
token (vLLM's ``cached_tokens`` in a response's usage, kvscope's ``num_cached_tokens``).

Pure: a ``HashCacheSnapshot`` and a ``FleetLedger`` in, frozen values out. The attach
server answers ``POST /locate`` with ``locate(...).to_dict()``; the dashboard draws the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.attach.ledger import FleetLedger, PodLedger
from engine.attach.prefix_match import BY_HASH, BY_TOKENS, PodPrefixMatch, detect_scheme, longest_prefix, stream_chain
from engine.events.folds.hash_cache_snapshot import HashCacheSnapshot, PodCacheView
from engine.events.folds.prefix_tree import PrefixTree

EVICTED, CLEARED, RESTART = "evicted", "cleared", "restart"
DIVERGED, OTHER_KEYS, NEVER_STORED = "diverged", "other_keys", "never_stored"
PARTIAL_BLOCK, BELOW_BLOCK, WHOLE_PROMPT, NO_BLOCKS = "partial_block", "below_block", "whole_prompt", "no_blocks"
REASONS = (EVICTED, CLEARED, RESTART, DIVERGED, OTHER_KEYS, NEVER_STORED, PARTIAL_BLOCK, BELOW_BLOCK,
           WHOLE_PROMPT, NO_BLOCKS)
TIER_ORDER = ("", "GPU", "CPU", "CPU_PINNED", "STORAGE", "DISK", "EXTERNAL")  # vLLM's and SGLang's media
MAX_PROMPT_TOKENS = 1 << 20  # a locate request past this is refused (the attach server's rule)


class LocateError(ValueError):
    """A prompt the locator cannot take (empty, not token ids, too long)."""


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first prompt block a tier does not hold, and why."""

    reason: str  # one of REASONS
    block: int | None  # its index in the prompt (None: the prompt has no uncached full block)
    token: int  # the first prompt token not cached there (diverged: the first that differs)
    detail: str
    hash: str | None = None  # the block's hash, where known
    ts: float | None = None  # evicted / cleared / restart: when (the engine's clock)
    step: int | None = None  # ... and at which step of the attached run
    age_s: float | None = None  # pod's latest ts - ts: how long ago
    cached_after: int = 0  # prompt blocks after the break this tier still holds (orphaned)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "block": self.block, "token": self.token, "detail": self.detail,
                "hash": self.hash, "ts": self.ts, "step": self.step, "age_s": self.age_s,
                "cached_after": self.cached_after}


@dataclass(frozen=True, slots=True)
class TierMatch:
    medium: str | None
    method: str  # BY_HASH | BY_TOKENS
    block_size: int | None
    num_prompt_tokens: int
    hashes: tuple[str, ...]  # the cached prefix's blocks
    chain_break: ChainBreak

    @property
    def cached_blocks(self) -> int:
        return len(self.hashes)

    @property
    def cached_tokens(self) -> int:
        return self.cached_blocks * (self.block_size or 0)

    @property
    def hit_tokens(self) -> int:
        return PodPrefixMatch("", self.method, self.block_size, self.num_prompt_tokens,
                              self.cached_blocks, self.hashes).hit_tokens

    def misses(self) -> dict[str, int]:
        """Each prompt token that would miss here, by one cause; they add up to
        ``num_prompt_tokens - hit_tokens``: ``last_token`` (cached, but the block holding the
        last token is recomputed for its logits), the break's reason for every full block from
        the break on (a chain is only reused up to its first missing block), and
        ``partial_block`` / ``below_block`` for the tokens that fill no block."""
        bs = self.block_size or 0
        n = self.num_prompt_tokens
        full = n // bs * bs if bs else 0
        out: dict[str, int] = {}

        def add(cause: str, k: int) -> None:
            if k > 0:
                out[cause] = out.get(cause, 0) + k

        add("last_token", self.cached_tokens - self.hit_tokens)
        add(self.chain_break.reason, full - self.cached_tokens)
        add(BELOW_BLOCK if bs and n < bs else PARTIAL_BLOCK, n - full)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.medium, "method": self.method, "cached_blocks": self.cached_blocks,
                "cached_tokens": self.cached_tokens, "hit_tokens": self.hit_tokens,
                "hashes": list(self.hashes), "break": self.chain_break.to_dict(), "misses": self.misses()}


@dataclass(frozen=True, slots=True)
class PodLocation:
    pod: str
    block_size: int | None
    num_prompt_tokens: int
    scheme: str | None  # the hash scheme detected (None: matched by token ids)
    incomplete: bool  # the pod's stream has a hole in its current segment
    tiers: tuple[TierMatch, ...]  # the engine's pool (GPU) first, then the offload tiers

    @property
    def best(self) -> TierMatch | None:
        """The tier with the longest cached prefix (the first on a tie)."""
        return max(self.tiers, key=lambda t: t.cached_blocks, default=None)

    @property
    def hit_tokens(self) -> int:
        b = self.best
        return 0 if b is None else b.hit_tokens

    def misses(self) -> dict[str, int]:
        """The best tier's miss causes (``TierMatch.misses``); every token ``no_blocks`` on a
        pod that has announced no block. They add up to the prompt less ``hit_tokens``."""
        b = self.best
        return {NO_BLOCKS: self.num_prompt_tokens} if b is None else b.misses()

    def to_dict(self) -> dict[str, Any]:
        b = self.best
        out: dict[str, Any] = {"pod": self.pod, "block_size": self.block_size,
                               "prompt_tokens": self.num_prompt_tokens, "scheme": self.scheme,
                               "incomplete": self.incomplete}
        if b is None:
            out.update(tier=None, method=None, cached_blocks=0, cached_tokens=0, hit_tokens=0,
                       **{"break": {"reason": NO_BLOCKS, "block": 0, "token": 0, "detail":
                                    "the pod has announced no cached block yet"}},
                       misses=self.misses())
        else:
            out.update(tier=b.medium, method=b.method, cached_blocks=b.cached_blocks,
                       cached_tokens=b.cached_tokens, hit_tokens=b.hit_tokens,
                       **{"break": b.chain_break.to_dict()}, misses=b.misses())
        out["tiers"] = [t.to_dict() for t in self.tiers]
        return out


def check_token_ids(ids: Any) -> list[int]:
    """The prompt as token ids, or LocateError saying what is wrong with it."""
    if not isinstance(ids, list):
        raise LocateError(f"token_ids must be a JSON array of integers, got {type(ids).__name__}")
    if not ids:
        raise LocateError("the prompt is empty: give at least one token")
    if len(ids) > MAX_PROMPT_TOKENS:
        raise LocateError(f"the prompt has {len(ids)} tokens; the locator takes at most {MAX_PROMPT_TOKENS}")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= 1 << 32:
            raise LocateError(f"token_ids[{i}] = {t!r} is not a token id (an integer in 0..2^32-1)")
    return ids


def locate(snapshot: HashCacheSnapshot, token_ids: Sequence[int], ledger: FleetLedger | None = None,
           pods: Sequence[str] | None = None) -> list[PodLocation]:
    """Every pod's (or ``pods``') answer for the prompt, in ``pods``' order (else the snapshot's)."""
    ids = check_token_ids(list(token_ids))
    names = list(pods) if pods is not None else list(snapshot.pods)
    out = []
    for name in names:
        view = snapshot.pods.get(name)
        if view is None:
            view = PodCacheView(name, 0, None, None, ())
        led = ledger.pods.get(name) if ledger is not None else None
        out.append(locate_pod(view, ids, led))
    return out


def locate_pod(view: PodCacheView, ids: Sequence[int], ledger: PodLedger | None = None) -> PodLocation:
    ids = list(ids)
    bs = view.block_size
    if not bs:
        return PodLocation(view.pod, bs, len(ids), None, view.incomplete, ())
    scheme = detect_scheme(view)
    # the tiers holding blocks; an emptied pod (cleared, restarted) still says what left
    held = {b.medium for b in view.blocks} or (ledger.mediums if ledger is not None else set()) or {None}
    mediums = sorted(held, key=_tier_rank)
    trees = {m: PrefixTree(view, m) for m in mediums}
    matches = {m: longest_prefix(view, ids, scheme, trees[m]) for m in mediums}
    chain: list[str] = list(stream_chain(ids, bs, scheme)) if scheme is not None else []
    if scheme is None:  # a placeholder tier has hashes only: follow another tier's token walk
        chain = list(max(matches.values(), key=lambda m: m.num_blocks).hashes)
        while ledger is not None and len(chain) < len(ids) // bs:  # on past the tiers: removals
            want = tuple(ids[len(chain) * bs:(len(chain) + 1) * bs])
            parent = chain[-1] if chain else None
            gone = next((r for m in mediums if (r := ledger.removal_by_tokens(m, parent, want))), None)
            if gone is None:
                break
            chain.append(gone.hash)
        for m in mediums:
            n = 0
            while n < len(chain) and chain[n] in trees[m].blocks:
                n += 1
            if n > matches[m].num_blocks:
                matches[m] = PodPrefixMatch(view.pod, BY_HASH, bs, len(ids), n, tuple(chain[:n]))
    tiers = []
    for m in mediums:
        found = matches[m]
        brk = _why(view, trees[m], m, ids, bs, found, chain, scheme, ledger)
        tiers.append(TierMatch(m, found.method, bs, len(ids), found.hashes, brk))
    return PodLocation(view.pod, bs, len(ids), scheme, view.incomplete, tuple(tiers))


def _tier_rank(medium: str | None) -> tuple[int, str]:
    """The engine's own pool first (GPU, or a stream without media), then the offload tiers."""
    m = (medium or "").upper()
    return (TIER_ORDER.index(m) if m in TIER_ORDER else len(TIER_ORDER), m)


def _why(view: PodCacheView, tree: PrefixTree, medium: str | None, ids: list[int], bs: int,
         found: PodPrefixMatch, chain: list[str], scheme: str | None,
         ledger: PodLedger | None) -> ChainBreak:
    n_full = len(ids) // bs
    i = found.num_blocks
    tier = medium or "the pod's cache"
    if i >= n_full:
        rest = len(ids) - n_full * bs
        if n_full == 0:
            return ChainBreak(BELOW_BLOCK, None, 0, f"the prompt's {len(ids)} tokens are fewer than one "
                              f"block of {bs}: engines cache full blocks only, so nothing can hit")
        if rest:
            return ChainBreak(PARTIAL_BLOCK, None, n_full * bs,
                              f"all {n_full} full blocks are cached on {tier}; the last {rest} "
                              f"token(s) do not fill a block of {bs} and are never cached")
        return ChainBreak(WHOLE_PROMPT, None, len(ids),
                          f"all {n_full} blocks are cached on {tier}; the engine still recomputes "
                          f"the last token, so a hit is {found.hit_tokens} tokens")
    prev = found.hashes[-1] if found.hashes else None
    want = tuple(ids[i * bs:(i + 1) * bs])
    h = chain[i] if i < len(chain) else None
    after = 0
    if h is not None:
        after = sum(1 for x in chain[i + 1:] if x in tree.blocks)
    gone = None
    if ledger is not None:
        gone = ledger.removal(medium, h) if h is not None else ledger.removal_by_tokens(medium, prev, want)
    last = view.last_ts
    if gone is not None:
        age = None if last is None else max(0.0, last - gone.ts)
        what = {EVICTED: "evicted (its last copy removed)", CLEARED: "cleared (AllBlocksCleared)",
                RESTART: "lost when the publisher restarted"}[gone.why]
        return ChainBreak(gone.why, i, i * bs, f"block {i} (tokens {i * bs}..{(i + 1) * bs - 1}) was "
                          f"cached on {tier} and {what} at step {gone.step}"
                          + ("" if age is None else f", {age:.1f} s before the pod's latest event"),
                          gone.hash, gone.ts, gone.step, age, after)
    if prev is None:
        candidates = [tree.blocks[r] for r in tree.roots if tree.blocks[r].parent is None]
    else:
        candidates = [tree.blocks[c] for c in tree.children.get(prev, ())]
    best, common = None, -1
    for c in candidates:
        if not c.token_ids:
            continue  # a placeholder: no tokens to compare
        k = 0
        while k < min(bs, len(c.token_ids)) and c.token_ids[k] == want[k]:
            k += 1
        if k > common:
            best, common = c, k
    where = "the prompt's first block" if prev is None else f"block {i - 1}"
    if best is not None and common >= bs:
        return ChainBreak(OTHER_KEYS, i, i * bs, f"{tier} caches block {i}'s tokens after {where} under "
                          f"another hash ({best.hash[:16]}): a LoRA adapter, cache salt, multimodal "
                          "extra keys or another hash seed", h, cached_after=after)
    if best is not None:
        k = i * bs + common
        return ChainBreak(DIVERGED, i, k, f"{tier} caches {len(candidates)} continuation(s) after "
                          f"{'the root' if prev is None else where}; the closest ({best.hash[:16]}) "
                          f"differs from prompt token {k}", h, cached_after=after)
    hole = " (the stream has a hole: a store or removal may be missing)" if view.incomplete else ""
    return ChainBreak(NEVER_STORED, i, i * bs, f"no block on {tier} continues the prompt after "
                      f"{'the root' if prev is None else where}, and none was removed since the "
                      f"attach: never stored there{hole}", h, cached_after=after)


__all__ = ["BY_HASH", "BY_TOKENS", "ChainBreak", "LocateError", "PodLocation", "REASONS", "TierMatch",
           "check_token_ids", "locate", "locate_pod"]
