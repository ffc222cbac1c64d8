"""The engine side of the server: the engine thread and the mailbox every front door writes to.

- ``engine_loop``: ``EngineWorker``, the one thread that owns the LLMEngine.
- ``mailbox``: letters (sink + op or lifecycle command) into the engine thread,
  deliveries out.
- ``sink``: ``Sink``, where the engine thread's answers for one front-door client go.
- ``request_book``: which sink owns each live request; in-flight and ``n`` limits.
- ``prompt_prep``: a submit's prompt checked and tokenized before the engine thread
  sees it (run in the hub's worker pool).
- ``output_messages``: a RequestOutput as ``output``/``finished`` messages.
- ``health``: loading → ready → stopping, as ``/healthz`` reports it.
"""
