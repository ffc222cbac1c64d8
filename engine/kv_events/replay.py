"""The replay protocol, both ends: a ROUTER that re-sends buffered batches, and a DEALER client.

Request (a DEALER sends ``[b"", start_seq]``; the ROUTER sees ``[identity, b"",
start_seq(8 bytes, big-endian)]``). Reply: one message per buffered batch with
seq >= start_seq, ``[identity, b"", topic, seq, payload]``, then the end marker
``[identity, b"", b"", END_SEQ, b""]``: current vLLM's layout (its PR #45177).
A batch older than the buffer is simply absent, so a client sees what it cannot
get back. Use DEALER, not REQ: a REQ socket receives only the first reply.
"""

from __future__ import annotations

import logging
from collections import deque

import zmq

from engine.kv_events.decoder import Frame, KVEventsDecodeError, parse_replay
from engine.kv_events.encoding import END_SEQ, seq_bytes

logger = logging.getLogger(__name__)


class ReplayBuffer:
    """The last ``maxlen`` (seq, payload) pairs. Writer and reader: the publisher thread."""

    def __init__(self, maxlen: int) -> None:
        self._buf: deque[tuple[int, bytes]] = deque(maxlen=maxlen)

    def __len__(self) -> int:
        return len(self._buf)

    def append(self, seq: int, payload: bytes) -> None:
        self._buf.append((seq, payload))

    def answer(self, router: zmq.Socket, topic: bytes) -> int:
        """Answer one waiting request on ``router``; returns the number of batches sent."""
        frames = router.recv_multipart()
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            logger.warning("kv events replay: ignoring a malformed request of %d frames "
                           "(expected [identity, b'', 8-byte start seq])", len(frames))
            if len(frames) >= 2:  # routable: end it, so a client never waits for nothing
                router.send_multipart((frames[0], b"", b"", END_SEQ, b""))
            return 0
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        sent = 0
        for seq, payload in self._buf:
            if seq >= start_seq:
                router.send_multipart((client, b"", topic, seq_bytes(seq), payload))
                sent += 1
        router.send_multipart((client, b"", b"", END_SEQ, b""))
        return sent


def fetch_replay(dealer: zmq.Socket, start_seq: int, timeout: float = 5.0) -> list[Frame]:
    """Ask a replay ROUTER for every batch from ``start_seq``; returns them, in order.

    Accepts both reply layouts. Raises TimeoutError when a reply does not come in
    ``timeout`` seconds, KVEventsDecodeError for a reply that is not the protocol.
    """
    dealer.send_multipart((b"", seq_bytes(start_seq)))
    out: list[Frame] = []
    while True:
        if not dealer.poll(int(timeout * 1000)):
            raise TimeoutError(f"no replay reply within {timeout}s (asked from seq {start_seq})")
        frames = dealer.recv_multipart()
        if not frames or frames[0] != b"":
            raise KVEventsDecodeError("a replay reply to a DEALER starts with an empty delimiter frame")
        frame = parse_replay(frames[1:])
        if frame.is_end:
            return out
        out.append(frame)
