"""Lessons: guided scenarios (predict, run, look), drawn by dashboard.lessons_page."""

from dashboard.lessons_page import render

render(replay_page="views/replay.py")
