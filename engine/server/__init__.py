"""The server that owns one live engine: the websocket and OpenAI front doors, /healthz, /metrics.

Kept free of imports on purpose: ``engine.server.commands`` is imported for every
CLI command, and the server side (``app``, ``worker.engine_loop``) pulls in torch and the
model only when a server starts. The wire format is ``engine.protocol``; the
clients are ``engine.client``.

Laid out by rooms, each sub-package's docstring mapping its modules (docs/architecture.md,
"Front doors"): ``port`` (the one listening port, shared with ``kvscope attach``),
``websocket`` and ``api`` (the two front doors), ``worker`` (the engine thread, its
mailbox and sinks), ``metrics`` (``/metrics``); ``app`` (``KVScopeServer``) puts them
together and ``commands`` is ``kvscope serve``.
"""
