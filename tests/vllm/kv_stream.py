"""An independent subscriber of a server's KV events for the vLLM tier: a plain pyzmq SUB
socket that keeps every payload as it arrived and folds the stream with plain dicts
(msgspec's untyped decode; nothing of engine.kv_events or engine.attach).

ZMQ's slow joiner: ``join`` resets the server's prefix cache until its AllBlocksCleared
arrives. Both vLLM and kvscope queue that event and publish it with their next engine
step, so a one-token request (no full block) follows each reset.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import msgspec
import zmq

from bench.vllm_servers import DEFAULT_KVSCOPE_BLOCKS, MODEL_NAME


class RawStream:
    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.frames: list[tuple[int, bytes]] = []  # (seq, payload), as received

    @property
    def payloads(self) -> list[bytes]:
        return [p for _, p in self.frames]

    @property
    def last_seq(self) -> int:
        return self.frames[-1][0] if self.frames else -1

    def pump(self, timeout: float) -> int:
        n = 0
        while self.sock.poll(int(timeout * 1000) if n == 0 else 0):
            _, seq, payload = self.sock.recv_multipart()
            self.frames.append((int.from_bytes(seq, "big"), payload))
            n += 1
        return n

    def settle(self, quiet: float = 1.5) -> None:
        while self.pump(quiet):
            pass

    def events(self, start: int = 0) -> list[dict]:
        return [e for p in self.payloads[start:] for e in msgspec.msgpack.decode(p)[1]]

    def join(self, server, client, timeout: float = 60.0) -> None:
        """Until this socket has seen an AllBlocksCleared; then forget what came before it."""
        deadline = time.monotonic() + timeout
        while not any(e["type"] == "AllBlocksCleared" for e in self.events()):
            assert server.reset_prefix_cache() == 200
            client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=1, temperature=0)
            self.pump(0.5)
            assert time.monotonic() < deadline, "no KV event arrived from the server"
        self.settle(0.5)
        self.frames.clear()

    def close(self) -> None:
        self.sock.close(0)


def fold_copies(events: list[dict]) -> Counter:
    """hash -> physical copies held, from BlockStored / BlockRemoved / AllBlocksCleared."""
    held: Counter = Counter()
    for e in events:
        if e["type"] == "BlockStored":
            held.update(e["block_hashes"])
        elif e["type"] == "BlockRemoved":
            for h in e["block_hashes"]:
                held[h] -= 1
                if held[h] <= 0:
                    del held[h]
        elif e["type"] == "AllBlocksCleared":
            held.clear()
    return held


def kvscope_with_events(kvscope_servers, tmp_path_factory):
    """The tier's kvscope serve (vLLM's usable pool) publishing KV events on one ipc:// socket
    per session: every test asking for it gets the same configuration, so the same server."""
    endpoint = f"ipc://{tmp_path_factory.getbasetemp()}/kvscope-kv-events.sock"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
    server = kvscope_servers(num_kv_blocks=DEFAULT_KVSCOPE_BLOCKS,
                             extra_args=("--kv-events-config", json.dumps(config)))
    server.events_endpoint = endpoint
    return server
