"""Errors the engine raises for bad input or config. Each message says what to change."""


class KVScopeError(ValueError):
    """Base class: bad input or configuration (never an engine bug)."""


class ConfigError(KVScopeError):
    """An engine or cache config value is invalid."""


class SamplingParamsError(KVScopeError):
    """A sampling parameter is invalid or out of range."""


class PromptTooLongError(KVScopeError):
    """A prompt does not fit in ``max_model_len``."""


class KVCacheTooSmallError(KVScopeError):
    """The KV cache budget cannot hold one ``max_model_len`` sequence."""


class QueueFullError(KVScopeError):
    """The bounded waiting queue is full; retry later."""


class EmptyPromptError(KVScopeError):
    """A prompt has no tokens (nothing to attend to, no logits to sample from)."""
