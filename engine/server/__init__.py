"""The server that owns one live engine: the websocket and OpenAI front doors, /healthz, /metrics.

Kept free of imports on purpose: ``engine.server.commands`` is imported for every
CLI command, and the server side (``app``, ``worker.engine_loop``) pulls in torch and the
model only when a server starts. The wire format is ``engine.protocol``; the
clients are ``engine.client``.

One port, two front doors, one mailbox (docs/architecture.md, "Front doors"):
- ``port``: the one listening port every kvscope server runs (``FrontDoor``: Starlette
  on uvicorn), its own routes (``/healthz``, ``/metrics``, the websocket door; ``http``),
  who may reach it (``security``: bind, Host, Origin, token), the websocket connection
  adapter (``ws_adapter``) and the worker's batches into the event loop (``handoff``).
  Shared with ``kvscope attach``.
- ``websocket``: the websocket front door on the event-loop thread: the ``Hub``
  (frames → ops → mailbox; deliveries → sinks and subscribers), one client as a
  ``ClientConn`` and its ``Outbox``, its inbound ops in order (``inbound``), its
  in-flight count (``in_flight``) and frame rate (``frame_rate``), and recent steps
  (``step_history``).
- ``api``: the OpenAI HTTP front door: the routes (``api_routes``), one call as an
  ``Exchange`` sink (``api_desk``), and requests in flight per client address
  (``client_quota``).
- ``worker``: the engine side: the engine thread (``engine_loop``, the only code that
  touches the LLMEngine), its ``Mailbox`` and the ``Sink`` every front door answers
  through, the ``RequestBook`` (which sink owns each live request), the prompt checks
  run before it (``prompt_prep``), a RequestOutput as messages (``output_messages``) and
  the health ``/healthz`` reports (``health``).
- ``metrics``: everything behind ``/metrics``: what the port needs of a registry
  (``hub_metrics``), serve's registry (``prom``: vLLM's names and labels) and its
  families.
- ``app``: ``KVScopeServer`` and ``ServerOptions``: the engine thread and the OpenAI
  routes on a ``FrontDoor``.
- ``commands``: ``kvscope serve``.
"""
