"""Guided lessons: predict, run the real engine, look, understand.

Each lesson module defines ``LESSON`` (a ``lessons.base.Lesson``). Importing this
package never imports torch, so the dashboard can list lessons and show their
text; running one (``lessons.runner.run_lesson``) loads the engine.
"""

from __future__ import annotations

from lessons import (
    l01_contiguous, l02_block_tables, l03_block_size, l04_chunked_prefill, l05_prefix_caching,
    l06_copy_on_write, l07_memory_pressure, l08_kv_budget, l09_prefix_routing,
    l10_cache_misses,
)
from lessons.base import Lesson

LESSONS: tuple[Lesson, ...] = tuple(m.LESSON for m in (
    l01_contiguous, l02_block_tables, l03_block_size, l04_chunked_prefill, l05_prefix_caching,
    l06_copy_on_write, l07_memory_pressure, l08_kv_budget, l09_prefix_routing,
    l10_cache_misses,
))


def get_lesson(number: int) -> Lesson:
    """The lesson with this number; ValueError naming the valid ones otherwise."""
    for lesson in LESSONS:
        if lesson.number == number:
            return lesson
    raise ValueError(f"no lesson {number}; choose one of "
                     f"{', '.join(str(x.number) for x in LESSONS)} (kvscope lesson --list)")


__all__ = ["LESSONS", "Lesson", "get_lesson"]
