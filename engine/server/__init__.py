"""The server that owns one live engine (websockets + the OpenAI API on one port), and its clients.

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
- ``http``: ``/healthz``, ``/metrics``, the websocket door and the token/Origin/loading gate.
- ``prom``: the Prometheus registry (vLLM names).
- ``security``: bind policy and token checks.
- ``app``: ``KVScopeServer`` and ``ServerOptions``: assemble (Starlette on uvicorn), run, shut down.
- ``ws_adapter``: the websocket route's connection as the Hub uses it (uvicorn websockets-sansio).
- ``client``: ``KVScopeClient`` (synchronous); ``live``: ``LiveConnection`` (background thread).
- ``commands``: ``kvscope serve`` and ``kvscope submit``.
"""
