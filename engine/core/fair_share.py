"""The "fair" scheduling policy's arithmetic over requests' clients (plain Python).

``SchedulerConfig.policy="fair"`` (``kvscope serve``'s default) shares the engine
between clients (``Request.client``): requests are served round-robin across clients
(each client's k-th before anyone's (k+1)-th; ``fair_order``), and with more than one
client at work each step is split into equal ``StepShares``. The Scheduler applies
them; preemption to rebalance seats stays there, since it touches the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.core.request import Request


def client_counts(reqs: Iterable[Request]) -> dict[str, int]:
    """How many of ``reqs`` each client has."""
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.client] = counts.get(r.client, 0) + 1
    return counts


def fair_order(reqs: Sequence[Request], held: dict[str, int] | None = None) -> list[Request]:
    """``reqs`` round-robin across clients: by (place among its client's requests,
    counting from ``held[client]``; place in ``reqs``). ``held``: what each client
    already has elsewhere (its running requests, when ordering the waiting ones)."""
    seen = dict(held or {})
    keyed = []
    for pos, r in enumerate(reqs):
        k = seen.get(r.client, 0)
        seen[r.client] = k + 1
        keyed.append((k, pos, r))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in keyed]


@dataclass(slots=True)
class StepShares:
    """What each client may still take of the step being scheduled: an equal part of
    the token budget and of ``max_num_seqs`` per client at work. What a client leaves
    unused is not handed to the others: the step is then smaller, so quicker for every
    client in it, rather than one client's burst making everyone else's next token
    wait for a full step."""

    tokens: dict[str, int]
    seqs: dict[str, int]

    @classmethod
    def split(cls, running: Iterable[Request], waiting: Iterable[Request], budget: int,
              max_num_seqs: int) -> StepShares | None:
        """The shares of a step with these requests; None with fewer than two clients
        at work (one budget, and "fair" is "fcfs")."""
        clients = {r.client for r in running}
        clients.update(r.client for r in waiting)
        if len(clients) < 2:
            return None
        return cls(dict.fromkeys(clients, max(1, budget // len(clients))),
                   dict.fromkeys(clients, max(1, max_num_seqs // len(clients))))

    def open(self, client: str) -> bool:
        return self.tokens[client] > 0 and self.seqs[client] > 0

    def spend(self, client: str, num_tokens: int) -> None:
        self.tokens[client] -= num_tokens
        self.seqs[client] -= 1
