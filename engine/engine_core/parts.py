"""EngineParts: what ``engine.engine_core.startup.build_engine_core`` made besides the
scheduler (the core holds them; a restart reuses the loaded weights).
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
