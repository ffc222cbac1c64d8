"""The OpenAI-compatible HTTP API on the serve port (``/v1/...``), through the same engine.

Every API request is submitted to the engine thread like a websocket ``submit``
(same events, same recording, with source ``openai``); only the shape of what comes
back differs. Pure Python except ``routes`` (Starlette).

Modules:
- ``errors``: ``ApiError`` and OpenAI's error body; the engine's error codes → HTTP status.
- ``request``: parsing and validation of completion and chat bodies → ``ApiRequest``.
- ``choices``: ``ChoiceState``, one choice (a prompt's sample) folded from RequestOutputs.
- ``response``: the JSON bodies and stream chunks (completions and chat), usage, logprobs.
- ``sse``: server-sent events framing.
- ``token_strings``: token ids → the strings and bytes logprobs show.
- ``desk``: ``ApiDesk`` and ``Exchange``, one HTTP request's link to the engine thread.
- ``routes``: the Starlette routes.
- ``snippets``: copy-paste client code for a running server (Submit page, README).
"""
