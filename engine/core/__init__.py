"""The engine core: requests, block pool, KV cache manager, scheduler. No torch."""

from engine.core.block_pool import Block, BlockPool, FreeBlockQueue
from engine.core.config import CacheConfig, SchedulerConfig, check_capacity
from engine.core.errors import (
    ConfigError, EmptyPromptError, KVCacheTooSmallError, KVScopeError, PromptTooLongError,
    QueueFullError, SamplingParamsError,
)
from engine.core.core_step import CoreStep, EngineCoreOutput
from engine.core.event_log import EventLog
from engine.core.kv_cache_manager import KVCacheManager, PrefixMatch
from engine.core.model_runner_output import ModelRunnerOutput, SampledToken
from engine.core.request import Request, RequestStatus, child_request_id
from engine.core.sampling_params import SamplingParams, is_greedy
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import NewRequestData, ScheduledRequest, SchedulerOutput

__all__ = [
    "Block", "BlockPool", "CacheConfig", "ConfigError", "CoreStep", "EmptyPromptError", "EngineCoreOutput",
    "EventLog", "FreeBlockQueue", "KVCacheManager", "KVCacheTooSmallError", "KVScopeError",
    "ModelRunnerOutput", "NewRequestData", "PrefixMatch", "PromptTooLongError", "QueueFullError",
    "Request", "RequestStatus", "SampledToken", "SamplingParams", "SamplingParamsError",
    "ScheduledRequest", "Scheduler", "SchedulerConfig", "SchedulerOutput",
    "check_capacity", "child_request_id", "is_greedy",
]
