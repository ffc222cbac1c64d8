"""A tiny recorded run shared by the store tests."""

from engine.events.schema.step import StepRecord
from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockFreed, PrefixLookup, RequestArrived, RequestFinished,
    RequestProgress, RequestScheduled,
)

CONFIG = {"num_blocks": 4, "block_size": 4, "max_num_batched_tokens": 16, "max_model_len": 8}


def _admit(step, rid, blocks, n):
    return ([RequestArrived(step, rid, n, tuple(range(n))),
             PrefixLookup(step, rid, n, 0, n, 0, 0, 0)]
            + [BlockAllocated(step, b, rid, i) for i, b in enumerate(blocks)]
            + [RequestScheduled(step, rid, n, "prefill")])


def records():
    """Steps 1..3: a (2 blocks) runs and finishes, b (1 block) keeps running."""
    return [
        StepRecord(0, 1, 10.0, _admit(1, "a", [0, 1], 6)
                   + [RequestProgress(1, "a", 7, 6, (9,)),
                      BlockCached(1, 0, "h0", None, (0, 1, 2, 3))],
                   {"kv_cache_usage": 0.5}),
        StepRecord(1, 2, 10.5, _admit(2, "b", [2], 3)
                   + [RequestProgress(2, "b", 4, 3, (8,)),
                      RequestProgress(2, "a", 8, 7, (7,))],
                   {"kv_cache_usage": 0.75}),
        StepRecord(2, 3, 11.0, [BlockFreed(3, 1, "a", 0), BlockFreed(3, 0, "a", 0),
                                RequestFinished(3, "a", "length"),
                                RequestProgress(3, "b", 5, 4, (6,))],
                   {"kv_cache_usage": 0.25}),
    ]


class FaultyDb:
    """Patches ``engine.store.db.connect`` to make the recorder's database read-only
    (``PRAGMA query_only``) or full (``PRAGMA max_page_count`` at its current size) on
    demand, mid-run (see ``set``). ``connects`` counts connections opened: after a
    failed attempt the recorder reopens, so this counts its attempts. Both pragmas
    last only as long as the connection they were set on."""

    def __init__(self, monkeypatch, mode=None):
        import threading

        from engine.store import db as dbm

        self.mode, self.connects, self.threads, self._open = mode, 0, set(), []
        real = dbm.connect

        def connect(*args, **kwargs):
            db = real(*args, **kwargs)
            self.connects += 1
            self.threads.add(threading.current_thread().name)
            self._open.append(db)
            self._apply(db, self.mode)
            return db

        monkeypatch.setattr(dbm, "connect", connect)

    def set(self, mode):
        """Start a fault (call it while the recorder is idle, e.g. right after a flush:
        it changes the open connection from this thread) or clear it (``None``: only new
        connections change, and the recorder reopens after each failed attempt, so a
        connection the writer may be using right now is never touched from here)."""
        self.mode = mode
        if mode is None:
            return
        for db in self._open:
            try:
                self._apply(db, mode)
            except Exception:  # closed by the recorder after a failure
                pass

    @staticmethod
    def _apply(db, mode):
        db.execute(f"pragma query_only = {int(mode == 'read-only')}")
        pages = db.execute("pragma page_count").fetchone()[0]
        db.execute(f"pragma max_page_count = {pages if mode == 'full' else 1 << 30}")


def padded(seq, pad=2000):
    """A step whose row needs pages of its own (so a full database refuses it)."""
    return StepRecord(seq, seq + 1, 100.0 + seq, [], {"pad": "x" * pad})


def wait_until(cond, timeout=10.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()
