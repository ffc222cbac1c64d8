"""Lesson text for a terminal: the narrative is markdown (the dashboard renders it), a
terminal shows it as plain text, bold as ANSI bold when it is a terminal that can.

Only the markdown the lessons use: ``**bold**``, ``*emphasis*`` and ```code```;
bullets ("- ") and line breaks read fine as they are.
"""

from __future__ import annotations

import re
from typing import TextIO

from engine import envs

_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.S)
# one star each side, not part of "**", not a multiplication ("2 * 3") or a glob
_EMPH = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")
_CODE = re.compile(r"`([^`\n]+)`")
BOLD_ON, BOLD_OFF = "\033[1m", "\033[0m"


def wants_ansi(stream: TextIO) -> bool:
    """Bold only on a real terminal that has not asked for no colour (NO_COLOR)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not envs.NO_COLOR.get() and \
        envs.TERM.get() != "dumb"


def render(text: str, ansi: bool = False) -> str:
    """``text`` without markdown marks; bold spans in ANSI bold when ``ansi``."""
    text = _CODE.sub(r"\1", text)
    text = _BOLD.sub((BOLD_ON + r"\1" + BOLD_OFF) if ansi else r"\1", text)
    return _EMPH.sub(r"\1", text)
