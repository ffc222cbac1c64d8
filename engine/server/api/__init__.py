"""The OpenAI HTTP front door (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
``/reset_prefix_cache``), in the formats of ``engine.openai``.

- ``api_routes``: the Starlette routes and the order of their checks.
- ``api_desk``: ``ApiDesk`` and ``Exchange``, one API call as a Sink of the engine thread.
- ``client_quota``: ``ClientQuota``, generation requests in flight per client address.
"""
