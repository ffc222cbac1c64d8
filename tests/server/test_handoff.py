"""LoopHandoff: batches posted while a wake-up is pending ride on it, in order."""

import asyncio
import threading

from engine.server.port.handoff import LoopHandoff


def test_batches_posted_before_the_loop_runs_share_one_wakeup_and_keep_their_order():
    got: list[list[int]] = []

    async def main():
        h = LoopHandoff(asyncio.get_running_loop(), got.append)
        t = threading.Thread(target=lambda: [h.post([i, i + 100]) for i in range(3)])
        t.start()
        t.join()  # the loop has not run since: all three are pending behind one wake-up
        assert h.wakeups == 1
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert got == [[0, 100, 1, 101, 2, 102]]
        h.post([7])  # drained: the next batch wakes the loop again
        assert h.wakeups == 2
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert got[-1] == [7]
        return h

    h = asyncio.run(main())
    h.post([9])  # the loop is closed: dropped, no error
    assert h.wakeups == 2
