"""The one port every kvscope server listens on (``kvscope serve`` and ``kvscope attach``).

- ``front_door``: ``FrontDoor``, Starlette on uvicorn around a worker: bind, record, run,
  shut down.
- ``http``: the port's own routes (``/healthz``, ``/metrics``, the websocket door), the
  ``HostCheck`` before every route and the errors of a route that does not take a method.
- ``security``: who may reach the server: bind policy, Host rule, Origin and token checks.
- ``ws_adapter``: a websocket route's connection as the Hub uses it (uvicorn's
  websockets-sansio protocol, with the transport reached).
- ``handoff``: the worker thread's delivery batches into the event loop, one wake-up at
  a time.
"""
