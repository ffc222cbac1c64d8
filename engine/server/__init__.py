"""The server that owns one live engine: the websocket front door, /healthz, /metrics.

Kept free of imports on purpose: ``engine.server.commands`` is imported for every
CLI command, and the server side (``app``, ``engine_loop``) pulls in torch and the
model only when a server starts. The wire format is ``engine.protocol``; the
clients are ``engine.client``.

Modules:
- ``sink``: ``Sink``, where the engine thread's answers for one front-door client go.
- ``mailbox``: letters (sink + op or lifecycle command) into the engine thread,
  deliveries out.
- ``engine_loop``: the engine thread (the only code that touches the LLMEngine).
- ``engine_restart``: rebuilding the engine for ``restart``, within the operator's limits.
- ``request_book``: which sink owns each live request; in-flight and ``n`` limits.
- ``output_messages``: a RequestOutput as ``output``/``finished`` messages.
- ``hub``: the websocket front door on the event-loop thread: frames → ops →
  mailbox; deliveries → sinks and subscribers.
- ``ws_connection``: ``ClientConn``, one websocket client as a Sink.
- ``outbox``: a client's outgoing queue (bounded step messages, replies first).
- ``step_history``: recent steps of the live run, and the answer to ``steps_since``.
- ``http``: ``/healthz``, ``/metrics`` and the auth/loading gate of the handshake.
- ``health``: loading → ready → stopping, as ``/healthz`` reports it.
- ``prom``: the Prometheus registry (vLLM's names and labels); ``metrics``: its families.
- ``security``: bind policy and token checks.
- ``app``: ``KVScopeServer`` and ``ServerOptions``: assemble, run, shut down.
- ``commands``: ``kvscope serve``.
"""
