"""Protocol v2: the websocket wire format between ``kvscope serve`` and its clients.

Pure Python (no torch, no I/O), shared by ``engine.server`` and ``engine.client``:
both ends encode and decode with these types.

- ``handshake``: how a connection opens (path, token, 503 while loading).
- ``ops``: client → server, one frame each; the parsed op is the command the
  engine thread executes.
- ``messages``: server → client, one frame each.
- ``errors``: ``ErrorCode`` and ``ProtocolError``.
- ``codec``: ``parse_op``, ``decode_message``, ``encode`` (JSON text frames).

Ops (``ops.OPS``) and messages (``messages.MESSAGES``) are documented, field by field,
where they are declared.

Ordering: on connect, ``hello`` then ``snapshot``. A client applies the ``step``
messages whose ``seq`` is greater than the last snapshot's ``seq`` (older ones
are already in it). ``seq`` grows by one per step; a gap means the server
dropped steps because this client read too slowly: send ``snapshot`` and
re-base, or fetch the missed steps with ``steps_since``. Replies to one
connection arrive in the order the engine made them. A new ``hello`` means a new
run (restart): ``seq`` starts again at 0 after the ``snapshot`` (seq -1) that
follows it. An idle engine sends nothing.
"""

from engine.events.schema.types import PROTOCOL_VERSION
from engine.protocol.codec import decode_message, encode, parse_op
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.messages import (
    Accepted, Error, Finished, Hello, Message, Ok, Output, Pong, Snapshot, Step, Steps,
)
from engine.protocol.ops import (
    RESTART_KEYS, Abort, AbortAll, Op, Ping, ResetPrefixCache, Restart, StepsSince, Submit, TakeSnapshot,
)
__all__ = [
    "PROTOCOL_VERSION", "RESTART_KEYS", "Abort", "AbortAll", "Accepted", "Error", "ErrorCode", "Finished",
    "Hello", "Message", "Ok", "Op", "Output", "Ping", "Pong", "ProtocolError", "ResetPrefixCache",
    "Restart", "Snapshot", "Step", "Steps", "StepsSince", "Submit", "TakeSnapshot",
    "decode_message", "encode", "parse_op",
]
