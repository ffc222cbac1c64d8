"""The OpenAI-compatible HTTP API on the serve port (``/v1/...``), through the same engine.

Every API request is submitted to the engine thread as the same protocol ``Submit``
op as a websocket ``submit``, by a Sink of its own (``engine.server.worker.sink``): same
events, same recording, with source ``openai``; only the shape of what comes back
differs. Pure Python, no I/O: the formats only. The front door that serves them (the
Starlette routes and the API call's Sink) is ``engine.server.api.api_routes`` and
``engine.server.api.api_desk``, so the server imports this package and not the reverse.

Modules:
- ``errors``: ``ApiError`` and OpenAI's error body; the engine's error codes → HTTP status.
- ``request``: parsing and validation of completion and chat bodies → ``ApiRequest``.
- ``choices``: ``ChoiceState``, one choice (a prompt's sample) folded from RequestOutputs.
- ``response``: the JSON bodies and stream chunks (completions and chat), usage, logprobs.
- ``sse``: server-sent events framing.
- ``token_strings``: token ids → the strings and bytes logprobs show.
- ``snippets``: copy-paste client code for a running server (Submit page, README).
"""
