"""KV cache events in vLLM's wire format: publisher (kvscope serve) and decoder (attach).

- ``config``: ``KVEventsConfig``, vLLM's ``--kv-events-config`` fields plus ``encoding``.
- ``types``: ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` and the batch.
- ``mapping``: kvscope's events → those, as vLLM's block pool emits them.
- ``encoding``: msgpack bytes, tagged maps (current vLLM) or tagged arrays (vLLM <= 0.23, SGLang).
- ``publisher``: ZMQ PUB off the engine thread, with the replay buffer.
- ``replay``: the ROUTER side and a DEALER client.
- ``decoder``: frames and payloads of either encoding and either replay layout.

This package's ``__init__`` imports only the config, so ``engine.config`` stays light;
pyzmq and msgspec load with the submodules that need them.
"""

from engine.kv_events.config import KVEventsConfig, should_bind

__all__ = ["KVEventsConfig", "should_bind"]
