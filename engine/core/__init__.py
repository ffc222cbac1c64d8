"""The engine core: requests, block pool, KV cache manager, scheduler. No torch."""

from engine.core.block_pool import Block, BlockPool, FreeBlockQueue
from engine.core.config import CacheConfig, SchedulerConfig, check_capacity
from engine.core.errors import (
    ConfigError, KVCacheTooSmallError, KVScopeError, PromptTooLongError, QueueFullError,
    SamplingParamsError,
)
from engine.core.event_log import EventLog
from engine.core.kv_cache_manager import KVCacheManager, PrefixMatch
from engine.core.request import Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput

__all__ = [
    "Block", "BlockPool", "CacheConfig", "ConfigError", "EventLog", "FreeBlockQueue",
    "KVCacheManager", "KVCacheTooSmallError", "KVScopeError", "PrefixMatch",
    "PromptTooLongError", "QueueFullError", "Request", "RequestStatus", "SamplingParams",
    "SamplingParamsError", "ScheduledRequest", "Scheduler", "SchedulerConfig",
    "SchedulerOutput", "check_capacity",
]
