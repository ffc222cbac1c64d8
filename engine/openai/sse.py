"""Server-sent events as OpenAI streams them: ``data: <json>\\n\\n`` per chunk, then
``data: [DONE]\\n\\n``. JSON is compact and keeps non-ASCII text as UTF-8 (the
stream is ``text/event-stream; charset=utf-8``)."""

from __future__ import annotations

import json
from typing import Any

MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def events(objs: list[dict[str, Any]]) -> bytes:
    return b"".join(event(o) for o in objs)
