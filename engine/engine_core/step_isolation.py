"""Step isolation: when a batched forward raises, find which requests cause it.

Issue 17: "If a step raises anyway, fail only the requests in that step, not the
engine", and one client's bad request must fail only that request. A batched step that
raises says nothing about which of its requests did it, so the engine re-runs the
step's requests one at a time (``split_step``), in scheduled order, and fails only
those whose own run raises. Why that is sound:

- The scheduler state is still the step's: ``schedule()`` ran, ``update_from_output``
  did not (no computed-token count moved, no token was appended), so each request's
  piece feeds the same tokens at the same positions into the same slots. The failed
  batch may have written some of those slots; the piece writes them again with the
  same tokens, and nothing else reads them in between.
- K/V a request reads and another one of the same step writes: a request admitted
  later in a step may hit a block an earlier one hashed at schedule, whose K/V this
  step writes (``KVCacheManager.allocate_slots``). Pieces run in scheduled order, so the
  writer runs first; if the writer failed, the reader read garbage and fails too
  (``Piece.reads`` against the failed pieces' ``writes``).
- Copy-on-write copies go with the piece whose table holds the copy (idempotent: the
  source block is shared and so never written). Finished ids go with every piece
  (dropping a runner state twice is a no-op, and a piece may be skipped). A request's ``NewRequestData`` goes with
  its piece: the runner rebuilds its sampling state, so a request new in this step
  samples exactly as it would have without the fault.
- A request that ran in an earlier step keeps its sampling state; its generator
  advanced in the failed batch only if the fault came after its noise was drawn (in
  ``sample``, after ``_exponential_noise``). Then its next seeded draw differs from a
  run without the fault. Greedy requests are unaffected.
- Blocks hashed at schedule lose their hashes either way (``uncache_uncomputed``, the
  caller's): the failed pieces' blocks are freed with garbage, and telling the good
  pieces' apart is not worth a second bookkeeping. Only prefix-cache reuse is lost.

Pure (no torch): it only reshapes ``SchedulerOutput``s; the engine runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.scheduler_output import SchedulerOutput


@dataclass(frozen=True, slots=True)
class Piece:
    """One scheduled request's share of a step, runnable on its own."""

    output: SchedulerOutput
    request_id: str
    reads: frozenset[int]  # block ids its attention reads (its table up to seq_len)
    writes: frozenset[int]  # block ids its new tokens' K/V go to


def split_step(out: SchedulerOutput, block_size: int) -> list[Piece]:
    """The step's scheduled requests as one-request steps, in scheduled order."""
    tables = [set(s.block_table) for s in out.scheduled]
    # a copy goes with the table holding its destination; one no table holds (its
    # request was preempted at schedule) with the first piece, as the batch ran it
    owner = {pair: next((i for i, t in enumerate(tables) if pair[1] in t), 0) for pair in out.cow_pairs}
    pieces: list[Piece] = []
    for i, s in enumerate(out.scheduled):
        mine = set(s.sample_ids) | {s.request_id}
        pieces.append(Piece(
            SchedulerOutput(out.step, [s], [p for p in out.cow_pairs if owner[p] == i], [],
                            out.token_budget, [n for n in out.new_requests if n.request_id in mine],
                            list(out.finished_request_ids), out.timestamp),
            s.request_id,
            frozenset(s.block_table[: -(-s.seq_len // block_size)]),
            frozenset(slot // block_size for slot in s.slot_mapping)))
    return pieces
