"""Compact JSON text, written fast: the one encoder of the step frames, the output frames
and the recorder's JSON columns.

A server step's events and metrics are written to every websocket and to the
recorder's row, and every request's output to its submitter, on the event-loop and
recorder threads: with the standard library's encoder that was a fifth of the time
the server process held the GIL under the soak's load, time the engine thread then
waited for (bench/RESULTS.md, session 9). msgspec's encoder writes the same
text 6-9x faster.

The text equals ``json.dumps(obj, separators=(",", ":"))`` (ASCII, strings escaped
alike, keys in order) for every value the engine writes, with two differences of
spelling only, never of value: a float that ``repr`` writes with an exponent may be
spelled without one (``1e-05`` as ``0.00001``, ``1e+16`` as ``1e16``), and a
non-finite float is ``null`` (the standard library's ``NaN`` is not JSON; the engine
writes none). Text that would not be ASCII (a non-ASCII character in a string; DEL too,
which the standard library escapes) or that
msgspec refuses (a lone surrogate, a type it does not know) is written by the
standard library instead, so the text is always ASCII: its length in characters is its
length in bytes, which the outbox bounds count.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_FAST = msgspec.json.Encoder()
_STD = json.JSONEncoder(separators=(",", ":"))


def compact_bytes(obj: Any) -> bytes | None:
    """``obj`` as ASCII JSON bytes by msgspec, or None where the standard library must
    write it (see the module's docstring)."""
    try:
        b = _FAST.encode(obj)
    except (TypeError, ValueError, UnicodeEncodeError, OverflowError):
        return None
    # the standard library escapes DEL as well as everything past ASCII
    return b if b.isascii() and b"\x7f" not in b else None


def compact(obj: Any) -> str:
    """``obj`` as compact ASCII JSON text (``json.dumps`` with ``separators=(",", ":")``;
    see the module's docstring for the two spellings that differ)."""
    b = compact_bytes(obj)
    return _STD.encode(obj) if b is None else b.decode("ascii")
