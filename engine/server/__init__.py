"""The websocket server that owns one live engine, and the clients that talk to it.

Kept free of imports on purpose: the dashboard imports ``engine.server.client``
and ``engine.server.live``, which must not pull in torch or the model. The
server side (``app``, ``engine_loop``) imports them only when a server starts.

Modules:
- ``protocol``: wire format v1 (ops in, messages out, error codes). Pure Python.
- ``engine_commands``: typed commands into the engine thread and deliveries out.
- ``engine_loop``: the engine thread (the only code that touches the LLMEngine).
- ``request_book``: which connection owns each live request; in-flight limits.
- ``outbox``: a client's outgoing queue (bounded step messages, replies first).
- ``hub``: the connections on the event-loop thread; ops → commands, deliveries → outboxes.
- ``http``: ``/healthz``, ``/metrics`` and the auth/loading gate of the handshake.
- ``prom``: the Prometheus registry (vLLM's names and labels); ``metrics``: its families.
- ``security``: bind policy and token checks.
- ``app``: ``KVScopeServer`` and ``ServerOptions``: assemble, run, shut down.
- ``client``: ``KVScopeClient`` (synchronous); ``live``: ``LiveConnection`` (background thread).
- ``commands``: ``kvscope serve`` and ``kvscope submit``.
"""
