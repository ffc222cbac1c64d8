"""Frozen, validated configs for the cache and the scheduler (plain Python).

The one home of the block-size rule (``check_block_size``, also asked by
``EngineConfig`` before any model loads) and of the capacity rule
(``check_capacity``, asked by the Scheduler, which the engine builds before it
allocates the KV tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.errors import ConfigError, EmptyPromptError, KVCacheTooSmallError, PromptTooLongError
from engine.core.hashing import DEFAULT_HASH_ALGO, HASH_ALGOS


MAX_BLOCK_SIZE = 1024  # tokens; vLLM's largest supported block is far smaller

# How the samples of an ``n > 1`` request share KV blocks (engine.events.versions:
# COPY_ON_WRITE, PREFIX_CACHE_SAMPLES):
# "cow" forks them after the prompt, sharing every block, the partial last one too, and
# copies a shared block before a write (the PagedAttention paper, vLLM v0); "prefix_cache"
# runs them as n separate child requests that share full prompt blocks through the prefix
# cache, each with its own partial last block (vLLM v1's parallel sampling).
N_SHARING_MODES = ("cow", "prefix_cache")

# CPU reduced-precision linears (``quantization=``; kernels/cpu_linear.py), never the default:
# "int8" stores weights as int8 per group of 32 and computes in float32; "w8a8" also rounds
# each linear's input to int8 per group of 32 for VNNI integer dot products at batch 1
# (llama.cpp's Q8 activations; "int8" on a CPU without AVX512-VNNI).
QUANTIZATIONS = ("int8", "w8a8")
# the KV cache's dtypes (EngineConfig.kv_cache_dtype, vLLM's --kv-cache-dtype): "auto" is the model's
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")

# The order the scheduler serves requests in (SchedulerConfig.policy). "fcfs" is vLLM's
# default: running requests, then waiting ones, by arrival; under block pressure the
# newest running request is preempted. "fair" is kvscope's own, for a server shared by
# clients: the same loop, but each client's k-th request comes before anyone's (k+1)-th,
# so the budget runs out, and preemption strikes, at the newest request of whichever
# client holds the most sequences; and a waiting request whose client holds fewer takes
# a seat (or blocks) from such a client by preempting that one. With one client "fair"
# is exactly "fcfs".
SCHEDULING_POLICIES = ("fcfs", "fair")


def check_prompt_length(num_tokens: int, max_model_len: int) -> None:
    """kvscope's one prompt-length rule: at least one token, and room beside it for one
    generated token. The scheduler holds every request to it, and the websocket front
    door before tokens reach the engine (``engine.server.worker.prompt_prep``); the
    OpenAI API words the same limit as vLLM does (``engine.openai.context_length``)."""
    if num_tokens == 0:
        raise EmptyPromptError("the prompt is empty; give at least one token")
    if num_tokens >= max_model_len:
        raise PromptTooLongError(
            f"the prompt has {num_tokens} tokens, {num_tokens - max_model_len + 1} more than fit: "
            f"max_model_len is {max_model_len} and room is needed for at least one generated "
            f"token; shorten the prompt or raise max_model_len")


def check_block_size(block_size) -> None:
    """Raise ConfigError unless ``block_size`` is an integer in [1, MAX_BLOCK_SIZE]."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or \
            not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ConfigError(f"block_size must be an integer in [1, {MAX_BLOCK_SIZE}], got {block_size!r}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The physical KV pool: ``num_blocks`` blocks of ``block_size`` token slots.

    ``prefix_caching_hash_algo``: how full blocks are hashed (engine.core.hashing)."""

    block_size: int = 16
    num_blocks: int = 256
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = DEFAULT_HASH_ALGO

    def __post_init__(self) -> None:
        check_block_size(self.block_size)
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ConfigError(f"prefix_caching_hash_algo must be one of {', '.join(map(repr, HASH_ALGOS))}, "
                              f"got {self.prefix_caching_hash_algo!r}")
        if not isinstance(self.num_blocks, int) or self.num_blocks < 1:
            raise ConfigError(f"num_blocks must be a positive integer, got {self.num_blocks!r}")

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits for one engine step and for sequences.

    ``long_prefill_token_threshold`` (0 = off) caps one request's tokens per step.
    ``max_waiting`` bounds the waiting queue (0 = unbounded).
    ``n_sharing`` is how ``n > 1`` samples share blocks (``N_SHARING_MODES``).
    ``policy`` is the order requests are served in (``SCHEDULING_POLICIES``).
    ``fair_ratio`` (0 = off; "fair" only): no client's share of a step is more than this
    many times what the lightest client at work could use of it
    (``engine.core.fair_share.StepShares``).
    """

    max_model_len: int = 2048
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    max_waiting: int = 0
    n_sharing: str = "cow"
    policy: str = "fcfs"
    fair_ratio: int = 0

    def __post_init__(self) -> None:
        check_n_sharing(self.n_sharing)
        check_scheduling_policy(self.policy)
        for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        check_fair_ratio(self.fair_ratio)
        for name in ("long_prefill_token_threshold", "max_waiting"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be an integer >= 0 (0 = off), got {v!r}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"with chunked prefill disabled a whole prompt must fit in one step: "
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len}); raise the budget, lower max_model_len, "
                f"or enable chunked prefill"
            )


def check_n_sharing(n_sharing) -> None:
    """Raise ConfigError unless ``n_sharing`` is one of ``N_SHARING_MODES``."""
    if n_sharing not in N_SHARING_MODES:
        raise ConfigError(f"n_sharing must be one of {', '.join(map(repr, N_SHARING_MODES))}, "
                          f"got {n_sharing!r}")


def check_scheduling_policy(policy) -> None:
    """Raise ConfigError unless ``policy`` is one of ``SCHEDULING_POLICIES``."""
    if policy not in SCHEDULING_POLICIES:
        raise ConfigError(f"scheduling_policy must be one of {', '.join(map(repr, SCHEDULING_POLICIES))}, "
                          f"got {policy!r}")


def check_fair_ratio(ratio) -> None:
    """Raise ConfigError unless ``ratio`` (``fair_ratio``) is an integer >= 0 (0 = off)."""
    if not isinstance(ratio, int) or isinstance(ratio, bool) or ratio < 0:
        raise ConfigError(f"fair_ratio must be an integer >= 0 (0 = off), got {ratio!r}")


def check_capacity(cache: CacheConfig, sched: SchedulerConfig) -> None:
    """Raise KVCacheTooSmallError when the pool cannot hold one max_model_len sequence."""
    needed = -(-sched.max_model_len // cache.block_size)
    if cache.num_blocks < needed:
        raise KVCacheTooSmallError(
            f"the KV cache has {cache.num_blocks} blocks of {cache.block_size} tokens "
            f"({cache.num_slots} token slots), but one max_model_len={sched.max_model_len} "
            f"sequence needs {needed} blocks; raise num_kv_blocks / kv_cache_memory "
            f"(or gpu_memory_utilization), or lower max_model_len"
        )
