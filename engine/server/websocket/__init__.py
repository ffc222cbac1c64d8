"""The websocket front door (protocol v2: the dashboard, ``kvscope submit``), on the event-loop thread.

- ``hub``: ``Hub``: frames → ops → the engine thread's mailbox; deliveries → sinks and
  subscribed connections.
- ``ws_connection``: ``ClientConn``, one websocket client as a Sink.
- ``outbox``: a client's outgoing queue (bounded in bytes, replies first).
- ``inbound``: a connection's ops on their way to the engine thread, in order, and its
  submits in flight.
- ``frame_rate``: how fast one connection may send, in frames and in bytes.
- ``step_history``: recent steps of the live run, and the answer to ``steps_since``.
"""
