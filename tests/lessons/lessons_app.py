"""A one-page app for AppTest: the Lessons page on its own."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dashboard.lessons_page import render  # noqa: E402

render()
