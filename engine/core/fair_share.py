"""The "fair" scheduling policy's arithmetic over requests' clients (plain Python).

``SchedulerConfig.policy="fair"`` (``kvscope serve``'s default) shares the engine
between clients (``Request.client``): requests are served round-robin across clients
(each client's k-th before anyone's (k+1)-th; ``fair_order``), and with more than one
client at work each step is split into equal ``StepShares``. The Scheduler applies
them; preemption to rebalance seats stays there, since it touches the pool.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from engine.core.request import Request


def client_counts(reqs: Iterable[Request]) -> dict[str, int]:
    """How many of ``reqs`` each client has."""
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.client] = counts.get(r.client, 0) + 1
    return counts


def _keyed(reqs: Sequence[Request], held: dict[str, int] | None) -> list[tuple[int, int, Request]]:
    """(place among its client's requests counting from ``held[client]``, place in
    ``reqs``, request); the places in ``reqs`` are distinct, so tuples never compare
    requests."""
    seen = dict(held or {})
    keyed = []
    for pos, r in enumerate(reqs):
        k = seen.get(r.client, 0)
        seen[r.client] = k + 1
        keyed.append((k, pos, r))
    return keyed


def fair_order(reqs: Sequence[Request], held: dict[str, int] | None = None) -> list[Request]:
    """``reqs`` round-robin across clients: by (place among its client's requests,
    counting from ``held[client]``; place in ``reqs``). ``held``: what each client
    already has elsewhere (its running requests, when ordering the waiting ones)."""
    keyed = _keyed(reqs, held)
    keyed.sort()
    return [r for _, _, r in keyed]


def fair_iter(reqs: Sequence[Request], held: dict[str, int] | None = None) -> Iterator[Request]:
    """``fair_order(reqs, held)``, lazily: admission usually stops after a few of a long
    waiting queue, so a heap (O(n) to build, O(log n) a pop) beats sorting it all every
    step. Iterates over a copy: the caller may remove from ``reqs`` as it goes."""
    keyed = _keyed(reqs, held)
    heapq.heapify(keyed)
    while keyed:
        yield heapq.heappop(keyed)[2]


# Under "fair" a client's share of a step is never below this many tokens, however light
# the lightest client is: a prompt chunk of one block costs a CPU step little more than one
# decode token (the weights are read once either way), and prefills must progress.
MIN_CHUNK_TOKENS = 16


def client_demands(reqs: Iterable[Request]) -> tuple[dict[str, int], dict[str, int]]:
    """Per client: how many of ``reqs`` it has, and how many tokens they have left to
    compute (what it could use of a step, if the step were its alone)."""
    seqs: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for r in reqs:
        c = r.client
        seqs[c] = seqs.get(c, 0) + 1
        tokens[c] = tokens.get(c, 0) + r.num_tokens - r.num_computed_tokens
    return seqs, tokens


def fair_first(reqs: Sequence[Request], held: dict[str, int]) -> Request:
    """``fair_order(reqs, held)[0]`` without sorting them all: the first request of the
    client holding fewest (``held`` plus its earlier requests in ``reqs`` never come
    first), the earliest in ``reqs`` on a tie."""
    best, best_key = None, None
    seen: set[str] = set()
    for pos, r in enumerate(reqs):
        if r.client in seen:
            continue  # a client's later requests rank after its first
        seen.add(r.client)
        key = (held.get(r.client, 0), pos)
        if best_key is None or key < best_key:
            best, best_key = r, key
    if best is None:
        raise ValueError("no requests")
    return best


@dataclass(slots=True)
class StepShares:
    """What each client may still take of the step being scheduled: an equal part of
    the token budget and of ``max_num_seqs`` per client at work. What a client leaves
    unused is not handed to the others: the step is then smaller, so quicker for every
    client in it, rather than one client's burst making everyone else's next token
    wait for a full step.

    With ``ratio`` > 0 a share is also at most ``ratio`` times what the lightest client
    at work could use of the step (its sequences; its tokens left, at least
    ``MIN_CHUNK_TOKENS``). Every request in a step waits for the whole step, and on a CPU
    a step's time grows with its sequences and tokens, so an equal part of a large
    budget still lets a heavy client set a light client's pace: 16 seats of a flood
    beside one chat request make each of its tokens several times slower. Bounding the
    ratio bounds that slowdown; the heavy client's requests still all advance, each on
    fewer of the steps (round-robin), and with one client, or only heavy ones, nothing
    changes."""

    tokens: dict[str, int]
    seqs: dict[str, int]

    @classmethod
    def split(cls, running: Iterable[Request], waiting: Iterable[Request], budget: int,
              max_num_seqs: int, ratio: int = 0) -> StepShares | None:
        """The shares of a step with these requests; None with fewer than two clients
        at work (one budget, and "fair" is "fcfs")."""
        seqs, tokens = client_demands([*running, *waiting])
        k = len(seqs)
        if k < 2:
            return None
        tok_share, seq_share = max(1, budget // k), max(1, max_num_seqs // k)
        if ratio > 0:
            tok_share = min(tok_share, ratio * max(min(tokens.values()), MIN_CHUNK_TOKENS))
            seq_share = min(seq_share, ratio * min(seqs.values()))
        return cls(dict.fromkeys(seqs, tok_share), dict.fromkeys(seqs, seq_share))

    def open(self, client: str) -> bool:
        return self.tokens[client] > 0 and self.seqs[client] > 0

    def spend(self, client: str, num_tokens: int) -> None:
        self.tokens[client] -= num_tokens
        self.seqs[client] -= 1
