"""EngineParts: what ``engine.startup.build_engine`` made besides the scheduler.

Its own module so that both ``engine.startup`` (the builder) and ``engine.llm_engine``
(the holder) can name it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core import CacheConfig, SchedulerConfig
from engine.model.loader import LoadedModel
from engine.model.model_runner import ModelRunner


@dataclass(frozen=True, slots=True)
class EngineParts:
    """The loaded weights (reused by a restart), the derived configs and the runner."""

    loaded: LoadedModel
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    runner: ModelRunner
    kv_bytes_per_block: int
