"""Frames: JSON text in and out, on both ends of the websocket.

The server parses client frames with ``parse_op`` and encodes messages with
``encode``; a client encodes ops with ``encode`` and decodes server frames with
``decode_message``. Compact JSON (no spaces): a step is encoded once and the same
text goes to every subscriber.
"""

from __future__ import annotations

import json

from engine.events.schema.json_text import compact
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.messages import Message, Step, message_from_dict
from engine.protocol.ops import Op, op_from_dict


def _loads(frame: str | bytes) -> object:
    try:
        return json.loads(frame)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        raise ProtocolError(ErrorCode.BAD_JSON, f"frame is not valid JSON: {exc}") from None


def parse_op(frame: str | bytes) -> Op:
    """A client's text frame as its typed op; raises ProtocolError with the reason."""
    return op_from_dict(_loads(frame))


def decode_message(frame: str | bytes) -> Message:
    """A server's text frame as its typed message; raises ProtocolError if it is none."""
    return message_from_dict(_loads(frame))


def encode(item: Message | Op) -> str:
    """Compact JSON text of a message or op (``engine.events.schema.json_text``; a step message
    reuses its record's text, written once for every reader)."""
    if isinstance(item, Step):
        return item.to_json()
    return compact(item.to_dict())
