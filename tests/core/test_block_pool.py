from engine.core import Block, EventLog, FreeBlockQueue
from engine.core.block_pool import BlockPool


def test_free_queue_order_and_middle_removal():
    blocks = [Block(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert q.ids() == [0, 1, 2, 3, 4]
    q.remove(blocks[2])
    assert q.ids() == [0, 1, 3, 4] and len(q) == 4
    assert q.popleft() is blocks[0]
    q.appendleft(blocks[2])
    q.append(blocks[0])
    assert q.ids() == [2, 1, 3, 4, 0]
    assert blocks[0] in q and blocks[2] in q


def test_release_puts_hashless_at_head_and_cached_at_tail():
    log = EventLog()
    pool = BlockPool(4, log)
    a, b = pool.take(), pool.take()
    assert (a.id, b.id) == (0, 1) and pool.free_queue.ids() == [2, 3]
    pool.cache(a, "h0", None, (1, 2))
    pool.release(b, "r")
    pool.release(a, "r")
    assert pool.free_queue.ids() == [1, 2, 3, 0]
    # taking the cached block evicts its hash
    pool.take(); pool.take(); pool.take()
    c = pool.take()
    assert c is a and c.hash is None and "h0" not in pool.cached
    types = [e.type for e in log.drain()]
    assert types == ["block_cached", "block_freed", "block_freed", "block_evicted"]


def test_duplicate_hash_is_not_cached_twice():
    pool = BlockPool(3, EventLog())
    a, b = pool.take(), pool.take()
    assert pool.cache(a, "h", None, (1,))
    assert not pool.cache(b, "h", None, (1,))
    assert pool.cached["h"] is a and b.hash is None
