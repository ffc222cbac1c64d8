"""KVEventsConfig: vLLM's ``--kv-events-config``, field for field, plus ``encoding``.

The JSON a vLLM operator already writes works unchanged::

    kvscope serve --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                                       "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'

Names, defaults and the ``publisher`` rule are vLLM's (``vllm/config/kv_events.py``):
``publisher`` left unset becomes ``"zmq"`` when events are enabled, ``"null"`` otherwise.
``encoding`` is kvscope's one extension: ``"map"`` (current vLLM: each event a map
tagged ``"type"``) or ``"array"`` (vLLM <= 0.23 and SGLang: each event a tagged array).

Plain Python (no zmq or msgspec import), so ``engine.config`` can hold one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
from dataclasses import dataclass
from typing import Any

from engine.core.errors import ConfigError

logger = logging.getLogger(__name__)

PUBLISHERS = ("null", "zmq")
ENCODINGS = ("map", "array")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None  # None: "zmq" if enable_kv_cache_events else "null" (vLLM's rule)
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # ZMQ send high-water mark (messages queued per subscriber)
    max_queue_size: int = 100_000  # steps queued for the publisher thread
    topic: str = ""
    encoding: str = "map"  # kvscope extension: "map" | "array"

    def __post_init__(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ConfigError(f"kv_events_config.enable_kv_cache_events must be true or false, "
                              f"got {self.enable_kv_cache_events!r}")
        if self.publisher is not None and self.publisher not in PUBLISHERS:
            raise ConfigError(f"kv_events_config.publisher must be one of {PUBLISHERS}, got {self.publisher!r}")
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"kv_events_config.{name} must be a string, got {getattr(self, name)!r}")
        if self.replay_endpoint is not None and (not isinstance(self.replay_endpoint, str)
                                                 or not self.replay_endpoint):
            raise ConfigError(f"kv_events_config.replay_endpoint must be an endpoint string or null, "
                              f"got {self.replay_endpoint!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"kv_events_config.{name} must be a positive integer, got {v!r}")
        if self.encoding not in ENCODINGS:
            raise ConfigError(f"kv_events_config.encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.effective_publisher == "zmq":
            for name in ("endpoint", "replay_endpoint"):
                v = getattr(self, name)
                if v is not None and "://" not in v:
                    raise ConfigError(f"kv_events_config.{name} must be a ZMQ endpoint such as "
                                      f"tcp://*:5557 or ipc:///tmp/kv.sock, got {v!r}")
        if self.publisher == "zmq" and not self.enable_kv_cache_events:
            logger.warning("kv_events_config: publisher is 'zmq' but enable_kv_cache_events is false, "
                           "so no KV events are published (vLLM's rule)")

    @property
    def effective_publisher(self) -> str:
        if self.publisher is not None:
            return self.publisher
        return "zmq" if self.enable_kv_cache_events else "null"

    @property
    def active(self) -> bool:
        """True when a ZMQ publisher runs: events enabled and the publisher is "zmq"."""
        return self.enable_kv_cache_events and self.effective_publisher == "zmq"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KVEventsConfig:
        """Build from a mapping; unknown keys are an error (a typo must not pass silently)."""
        if not isinstance(d, dict):
            raise ConfigError(f"kv_events_config must be a JSON object, got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ConfigError(f"kv_events_config: unknown field(s) {', '.join(map(repr, unknown))}; "
                              f"known fields: {', '.join(known)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"kv_events_config is not valid JSON ({exc}): {text!r}") from None
        return cls.from_dict(d)

    @classmethod
    def coerce(cls, value: KVEventsConfig | dict | str | None) -> KVEventsConfig | None:
        """A KVEventsConfig from what a caller may hand over: the object, a dict or JSON text."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.from_json(value)
        if isinstance(value, dict):
            return cls.from_dict(value)
        raise ConfigError(f"kv_events_config must be a KVEventsConfig, a dict or a JSON string, "
                          f"got {type(value).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def network_binds(self) -> list[str]:
        """The endpoints this config binds on an address other machines can reach.

        The stream carries prompt token ids and ZMQ has no authentication, so a server
        that keeps to loopback by default asks for an explicit opt-in for these.
        """
        if not self.active:
            return []
        binds = [self.endpoint] if should_bind(self.endpoint) else []
        if self.replay_endpoint is not None:
            binds.append(self.replay_endpoint)  # the replay ROUTER always binds
        return [e for e in binds if e.startswith("tcp://") and not _loopback_tcp(e)]


def _loopback_tcp(endpoint: str) -> bool:
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name or a hostname: assume reachable


def should_bind(endpoint: str) -> bool:
    """vLLM's heuristic: bind stable endpoints (wildcards, ipc, inproc), connect to the rest.

    ``tcp://*:5557`` and ``tcp://[::]:5557`` bind here; ``tcp://router:5557`` connects
    out to a subscriber that bound it (llm-d's router binds, the pods connect).
    """
    return ("*" in endpoint or "::" in endpoint or endpoint.startswith("ipc://")
            or endpoint.startswith("inproc://"))
