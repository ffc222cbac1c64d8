"""The server that owns one live engine: the websocket and OpenAI front doors, /healthz, /metrics.

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
- ``http``: ``/healthz``, ``/metrics``, the websocket door and the token/Origin/loading gate
  (Starlette routes).
- ``api_routes``: the OpenAI API's routes (``/v1/...``, ``/reset_prefix_cache``), in the
  formats of ``engine.openai``.
- ``api_desk``: ``ApiDesk`` and ``Exchange``, one OpenAI API call as a Sink.
- ``ws_adapter``: the websocket route's connection as the Hub uses it (uvicorn's
  websockets-sansio protocol, with the transport reached).
- ``health``: loading → ready → stopping, as ``/healthz`` reports it.
- ``prom``: the Prometheus registry (vLLM's names and labels); ``metrics``: its families.
- ``security``: bind policy and token checks.
- ``front_door``: ``FrontDoor``, the one port (Starlette on uvicorn) around a worker,
  shared with ``kvscope attach``: bind, record, run, shut down.
- ``hub_metrics``: what the port needs of a ``/metrics`` registry.
- ``app``: ``KVScopeServer`` and ``ServerOptions``: the engine thread and the OpenAI
  routes on a ``FrontDoor``.
- ``commands``: ``kvscope serve``.
"""
