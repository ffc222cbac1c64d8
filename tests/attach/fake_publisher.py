"""A synthetic KV event publisher, written from the format description alone (pyzmq + msgspec).

It does not import ``engine.kv_events``: it writes the bytes vLLM and SGLang write
(see REFERENCES.md "vLLM KV cache events, exactly"), so attach mode is tested
against the format, not against kvscope's own encoder.

- PUB frames ``[topic, seq (8 bytes big-endian, from 0), msgpack payload]``;
  payload ``[ts, events, data_parallel_rank]``.
- events as tagged maps (``{"type": "BlockStored", ...}``, current vLLM/SGLang) or
  tagged arrays (``["BlockStored", block_hashes, parent, token_ids, block_size,
  lora_id, medium, lora_name]``, vLLM <= 0.23 / older SGLang);
- a replay ROUTER answering ``[identity, b"", start_seq]`` with every buffered batch
  from there, as ``[seq, payload]`` (SGLang, older vLLM) or ``[topic, seq, payload]``
  (current vLLM), then an end marker with seq -1 (``0xFF`` x 8) and an empty payload.

Knobs for the tests: ``drop_live`` (a batch kept for replay but not sent live: a
gap replay can fill), ``drop_replay`` (not kept for replay either: a hole),
``extra`` (unknown fields a newer engine would add), ``restart()`` (seq back to 0,
buffer empty, sockets closed and bound again, as a restarted engine).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import msgspec
import zmq

END = b"\xff" * 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored(hashes: list, parent: Any, tokens: list[int], block_size: int, medium: str | None = "GPU",
           **extra: Any) -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": block_size, "lora_id": None, "medium": medium,
            "lora_name": None, **extra}


def removed(hashes: list, medium: str | None = "GPU", **extra: Any) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium, **extra}


def cleared() -> dict:
    return {"type": "AllBlocksCleared"}


_ORDER = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                          "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                          "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"),
          "BlockRemoved": ("block_hashes", "medium", "group_idx", "locality", "ownership"),
          "AllBlocksCleared": ()}  # vLLM 0.32's field order (vllm/distributed/kv_events.py)


def as_array(event: dict) -> list:
    """The tagged-array form: tag, then the fields in vLLM's order, then any extra ones."""
    known = _ORDER.get(event["type"], ())
    extra = [v for k, v in event.items() if k != "type" and k not in known]
    return [event["type"], *(event.get(k) for k in known), *extra]


class FakePublisher:
    def __init__(self, encoding: str = "map", replay_layout: int = 3, topic: bytes = b"",
                 endpoint: str | None = None, replay: bool = True, dp_rank: int | None = 0) -> None:
        assert encoding in ("map", "array") and replay_layout in (2, 3)
        self.encoding, self.replay_layout, self.topic, self.dp_rank = encoding, replay_layout, topic, dp_rank
        self.endpoint = endpoint or f"tcp://127.0.0.1:{free_port()}"
        self.replay_endpoint = f"tcp://127.0.0.1:{free_port()}" if replay else None
        self.ctx = zmq.Context.instance()
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()
        self.replays_answered = 0
        self._stop = threading.Event()
        self._open()

    # ---- sockets ---------------------------------------------------------------------

    def _open(self) -> None:
        # XPUB: a PUB that also tells us when a subscriber joined (wait_subscriber)
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.linger = 0
        self.pub.bind(self.endpoint)
        self.router = None
        self._thread = None
        if self.replay_endpoint is not None:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.linger = 0
            self.router.bind(self.replay_endpoint)
            self._stop.clear()
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def wait_subscriber(self, timeout: float = 10.0) -> None:
        """Until a SUB socket subscribed (ZMQ drops what a PUB sends before that)."""
        assert self.pub.poll(int(timeout * 1000)), "no subscriber joined"
        msg = self.pub.recv()
        assert msg[:1] == b"\x01", msg

    def _close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.pub.close(0)
        if self.router is not None:
            self.router.close(0)

    def close(self) -> None:
        self._close()

    def restart(self) -> None:
        """A new publisher process on the same endpoints: seq from 0, nothing buffered."""
        self._close()
        time.sleep(0.2)  # let the subscriber see the disconnect
        with self.lock:
            self.seq = 0
            self.buffer.clear()
        self._open()

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            ident, empty, start = self.router.recv_multipart()
            assert empty == b"" and len(start) == 8
            start_seq = int.from_bytes(start, "big")
            with self.lock:
                batches = [(s, p) for s, p in self.buffer if s >= start_seq]
            head = [self.topic] if self.replay_layout == 3 else []
            for s, p in batches:
                self.router.send_multipart([ident, b"", *head, s.to_bytes(8, "big"), p])
            self.router.send_multipart([ident, b"", *([b""] if self.replay_layout == 3 else []), END, b""])
            self.replays_answered += 1

    # ---- publishing ------------------------------------------------------------------

    def encode(self, events: list[dict], ts: float | None = None) -> bytes:
        wire = events if self.encoding == "map" else [as_array(e) for e in events]
        batch = [time.time() if ts is None else ts, wire]
        if self.dp_rank is not None:
            batch.append(self.dp_rank)
        return msgspec.msgpack.encode(batch)

    def publish(self, events: list[dict], drop_live: bool = False, drop_replay: bool = False,
                payload: bytes | None = None, ts: float | None = None) -> int:
        """Send one batch; returns its seq."""
        data = self.encode(events, ts) if payload is None else payload
        with self.lock:
            seq = self.seq
            self.seq += 1
            if not drop_replay:
                self.buffer.append((seq, data))
        if not drop_live:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), data])
        return seq

    def send_raw(self, frames: list[bytes]) -> None:
        """A message that is not the protocol (wrong frame count or seq size)."""
        self.pub.send_multipart(frames)
