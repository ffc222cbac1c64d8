"""EngineConfig: everything fixed when an engine starts (validated, frozen)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.core.config import (
    KV_CACHE_DTYPES, QUANTIZATIONS, check_block_size, check_fair_ratio, check_n_sharing, check_scheduling_policy,
)
from engine.core.errors import ConfigError
from engine.core.hashing import DEFAULT_HASH_ALGO, HASH_ALGOS
from engine.kv_events.config import KVEventsConfig

DEFAULT_MODEL = "smollm2-135m"
# The CPU KV budget when neither num_kv_blocks nor kv_cache_memory is given: 1 GiB
# (~1450 blocks of 16 tokens for SmolLM2 in fp32), capped at what max_num_seqs
# full-length sequences can use (engine.engine_core.startup), so a tiny model gets a small pool.
DEFAULT_CPU_KV_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine options, vLLM-named. ``None`` means "derive at startup".

    Block size, pool size and the chunk budget shape the KV tensors and the
    scheduler, so changing them means starting a new engine.
    """

    model: str = DEFAULT_MODEL
    block_size: int = 16
    max_model_len: int | None = None  # None: min(model limit, 2048)
    enable_prefix_caching: bool = True
    # how full blocks are hashed (engine.core.hashing.HASH_ALGOS): "sha256" / "sha256_cbor"
    # are vLLM's and give a real vLLM's block hashes; "kvscope" is kvscope's own
    prefix_caching_hash_algo: str = DEFAULT_HASH_ALGO
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int | None = None  # None: 512 (chunked) or max_model_len
    max_num_seqs: int = 64
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None  # bytes, CPU budget (also honoured on CUDA)
    gpu_memory_utilization: float = 0.9
    device: str = "auto"
    dtype: str = "auto"
    # the KV cache's dtype, as vLLM's --kv-cache-dtype: "auto" (the model's), "float32" or, on
    # the CPU, "bfloat16" (half the bytes a block and a decode step read)
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # "int8" / "w8a8" (CPU; engine/core/config.py QUANTIZATIONS)
    num_threads: int | None = None  # CPU torch threads; None: engine/cpu_threads.py decides
    attention_backend: str = "auto"
    seed: int = 0
    trust_remote_code: bool = False
    long_prefill_token_threshold: int = 0
    max_waiting: int = 0
    enable_events: bool = True
    # n > 1 sharing: "cow" (paper / vLLM v0 forks) or "prefix_cache" (vLLM v1 child requests)
    n_sharing: str = "cow"
    # the order requests are served in: "fcfs" (vLLM's) or "fair" (per client; serve's default)
    scheduling_policy: str = "fcfs"
    # "fair" only: a client's share of a step is at most this many times what the lightest
    # client at work could use (0 = off; serve's default is engine.server.commands'
    # FAIR_RATIO); engine.core.fair_share.StepShares
    fair_ratio: int = 0
    kv_events_config: KVEventsConfig | None = None  # vLLM-format KV cache events (engine.kv_events)
    # where the engine core (scheduler, runner) runs: False in this process, True in a
    # child of its own (engine.engine_core.client; kvscope serve's default)
    engine_core_process: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("model must be a model name, a local HF directory or a .gguf path")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ConfigError(f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1):
            raise ConfigError(f"num_kv_blocks must be a positive integer, got {self.num_kv_blocks!r}")
        if self.kv_cache_memory is not None and (not isinstance(self.kv_cache_memory, int) or self.kv_cache_memory < 1):
            raise ConfigError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ConfigError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ConfigError(f"num_threads must be a positive integer, got {self.num_threads!r}")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ConfigError(f"quantization must be None or one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ConfigError(f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}")
        check_block_size(self.block_size)
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ConfigError(f"prefix_caching_hash_algo must be one of {', '.join(map(repr, HASH_ALGOS))}, "
                              f"got {self.prefix_caching_hash_algo!r}")
        check_n_sharing(self.n_sharing)
        check_scheduling_policy(self.scheduling_policy)
        check_fair_ratio(self.fair_ratio)
        if not isinstance(self.engine_core_process, bool):
            raise ConfigError(f"engine_core_process must be True or False, got {self.engine_core_process!r}")
        self._check_kv_events()

    def _check_kv_events(self) -> None:
        kv = self.kv_events_config
        if kv is None:
            return
        if not isinstance(kv, KVEventsConfig):
            raise ConfigError(f"kv_events_config must be a KVEventsConfig (KVEventsConfig.coerce reads a "
                              f"dict or JSON), got {type(kv).__name__}")
        if kv.active and not self.enable_prefix_caching:
            raise ConfigError("KV cache events need prefix caching (they report cached blocks); "
                              "enable prefix caching or drop kv_events_config")
        if kv.active and not self.enable_events:
            raise ConfigError("KV cache events are derived from the engine's events; "
                              "they need enable_events=True")

    def to_dict(self) -> dict:
        return asdict(self)
