"""Request ids: the one rule for an id a caller chooses, checked where requests enter.

An id names a request in events, log lines, SQLite keys, the dashboard
and URLs, so it must be short, printable and need no escaping anywhere:
1..128 characters of ``A-Z a-z 0-9 . _ : - @ / + =``. That covers UUIDs, OpenAI-style
``cmpl-…`` ids, base64 (plain and url-safe) and ``user:42`` / ``tenant/run`` names.
Excluded, with a reason each: ``#`` (it names fork samples, ``a#1``), whitespace and
control characters (they break log lines), quotes and backslashes (they need escaping),
and anything outside ASCII — a lone surrogate such as ``"x\\ud800"`` cannot even be
encoded as UTF-8, so SQLite could never store it.

Callers: ``LLMEngine.add_request`` (every API) and the websocket ``submit``/``abort``
parse in ``engine.protocol.ops``. Ids the engine makes itself (``req-0``,
``c1-2``, ``a#1``) are not checked here; they are well formed by construction.
"""

from __future__ import annotations

import re

from engine.core.errors import KVScopeError

MAX_REQUEST_ID_LEN = 128  # ids land in SQLite keys and log lines; longer ones are a mistake
REQUEST_ID_CHARS = "A-Z a-z 0-9 . _ : - @ / + ="
_VALID = re.compile(r"[A-Za-z0-9._:@/+=-]+")
_SHOWN = 40  # characters of a rejected id echoed back (as ASCII): enough to know it, never 1 MB


class RequestIdError(KVScopeError):
    """A caller-chosen request id breaks the rule above."""


def check_request_id(request_id: object) -> str:
    """``request_id`` itself if it follows the rule; else RequestIdError saying why."""
    if not isinstance(request_id, str):
        raise RequestIdError(f"request_id must be a string, got {type(request_id).__name__}")
    shown = ascii(request_id[:_SHOWN]) + ("..." if len(request_id) > _SHOWN else "")
    if not 0 < len(request_id) <= MAX_REQUEST_ID_LEN:
        raise RequestIdError(f"request_id must be 1..{MAX_REQUEST_ID_LEN} characters, "
                             f"got {len(request_id)}: {shown}")
    if _VALID.fullmatch(request_id) is None:
        raise RequestIdError(f"request_id may only use the characters {REQUEST_ID_CHARS} "
                             f"(no spaces, '#', quotes or non-ASCII), got {shown}")
    return request_id
