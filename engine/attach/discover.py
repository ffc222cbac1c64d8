"""Pods discovered from an SGLang server: ``kvscope attach --sglang http://HOST:30000``.

SGLang's ``GET /server_info`` (``/get_server_info`` before it) answers its ``ServerArgs``
flattened into one JSON object, with ``status``, ``internal_states`` and ``version`` beside.
Of those, attach reads:

- ``kv_events_config``: the ``--kv-events-config`` JSON as given, a *string* (null when the
  server publishes no events); parsed, SGLang's ``KVEventsConfig`` fields: ``publisher``
  (``"zmq"``; ``"null"`` or absent: none), ``endpoint`` (default ``tcp://*:5557``),
  ``replay_endpoint`` (optional), ``topic`` (default ``""``), and ``buffer_steps``, ``hwm``,
  ``max_queue_size`` (not needed here);
- ``enable_dp_attention`` and ``dp_size``: with attention data parallelism each DP rank
  publishes on its own port, ``PORT + rank`` (SGLang's ``offset_endpoint_port``, vLLM's rule),
  so one pod per rank (``NAME-dp{r}``); ``nnodes`` > 1 spreads the ranks over hosts this
  answer does not name, and is refused;
- ``enable_metrics``: the server's Prometheus figures are at ``/metrics`` of the same URL.

A wildcard endpoint (``tcp://*:5557``, ``tcp://0.0.0.0:5557``, ``tcp://[::]:5557``) is where
the server binds: attach connects to the URL's host on that port. A concrete tcp address is
one the server *connects out to* (the publisher's rule, ``pod_source.subscriber_binds``):
attach would have to listen there, so it is refused with what to run instead; so is an
``inproc://`` endpoint (inside the server's process). An ``ipc://`` path is used as is (the
server runs on this machine).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from engine.attach.pod_source import PodSource, data_parallel_pods, subscriber_binds
from engine.core.errors import ConfigError

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")  # newest first
TIMEOUT_S = 10.0
MAX_INFO_BYTES = 8 << 20  # a real answer is ~150 kB (every server arg, per DP rank)


def fetch_server_info(url: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The server's ``/server_info`` as a dict; ConfigError saying why not."""
    base = _base(url)
    last = ""
    for path in SERVER_INFO_PATHS:
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as resp:
                raw = resp.read(MAX_INFO_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                last = f"{base + path} answered 404"
                continue  # an older server: /get_server_info
            hint = " (the server has --api-key: attach with --kv-events instead)" if exc.code == 401 else ""
            raise ConfigError(f"--sglang {url}: {base + path} answered HTTP {exc.code}{hint}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConfigError(f"--sglang {url}: cannot reach {base + path}: {reason}") from None
        if len(raw) > MAX_INFO_BYTES:
            raise ConfigError(f"--sglang {url}: {base + path} answered over {MAX_INFO_BYTES} bytes")
        try:
            info = json.loads(raw)
        except ValueError:
            raise ConfigError(f"--sglang {url}: {base + path} did not answer JSON: is it an SGLang "
                              "server?") from None
        if not isinstance(info, dict):
            raise ConfigError(f"--sglang {url}: {base + path} answered {type(info).__name__}, not an object")
        return info
    raise ConfigError(f"--sglang {url}: not an SGLang server ({last}; {SERVER_INFO_PATHS[1]} neither)")


def sglang_pods(url: str, info: dict[str, Any], name: str | None = None) -> list[PodSource]:
    """The pods an SGLang server's ``/server_info`` answer names (one per attention-DP rank)."""
    base = _base(url)
    host = urlsplit(base).hostname or ""
    name = name or urlsplit(base).netloc
    cfg = info.get("kv_events_config")
    if cfg is None:
        raise ConfigError(f"--sglang {url}: the server publishes no KV events (kv_events_config is null): "
                          "start it with --kv-events-config '{\"publisher\": \"zmq\", \"endpoint\": "
                          "\"tcp://*:5557\"}'")
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except ValueError:
            raise ConfigError(f"--sglang {url}: kv_events_config is not JSON: {cfg[:200]!r}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"--sglang {url}: kv_events_config must be a JSON object, got {type(cfg).__name__}")
    publisher = cfg.get("publisher")
    if publisher not in ("zmq", None):  # None: SGLang's default, zmq once a config is given
        raise ConfigError(f"--sglang {url}: the server's KV event publisher is {publisher!r}, not \"zmq\": "
                          "it publishes nothing attach can follow")
    endpoint = _reachable(url, host, cfg.get("endpoint") or "tcp://*:5557", "endpoint")
    replay = cfg.get("replay_endpoint")
    replay = None if not replay else _reachable(url, host, replay, "replay_endpoint")
    topic = cfg.get("topic") or ""
    if not isinstance(topic, str):
        raise ConfigError(f"--sglang {url}: kv_events_config.topic must be a string, got {topic!r}")
    metrics = base + "/metrics" if info.get("enable_metrics") else None
    ranks = 1
    if info.get("enable_dp_attention"):
        ranks = info.get("dp_size") or 1
        if not isinstance(ranks, int) or ranks < 1:
            raise ConfigError(f"--sglang {url}: dp_size must be an integer >= 1, got {ranks!r}")
        if (info.get("nnodes") or 1) > 1 and ranks > 1:
            raise ConfigError(f"--sglang {url}: the server's {ranks} DP ranks run on {info['nnodes']} "
                              "nodes, which /server_info does not name: give each node's ranks with "
                              "--kv-events tcp://NODE:PORT --data-parallel-size N")
    return data_parallel_pods(PodSource(name, endpoint, replay, topic, metrics), ranks)


def discover_sglang(url: str, name: str | None = None, timeout: float = TIMEOUT_S) -> list[PodSource]:
    return sglang_pods(url, fetch_server_info(url, timeout), name)


def _base(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"--sglang must be the server's http(s) URL such as http://HOST:30000, got {url!r}")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _reachable(url: str, host: str, endpoint: Any, field: str) -> str:
    """Where attach reaches a ZMQ endpoint the server publishes on."""
    if not isinstance(endpoint, str):
        raise ConfigError(f"--sglang {url}: kv_events_config.{field} must be a string, got {endpoint!r}")
    if endpoint.startswith("inproc://"):
        raise ConfigError(f"--sglang {url}: kv_events_config.{field} {endpoint} lives inside the "
                          "server's process: nothing outside it can subscribe")
    if endpoint.startswith("ipc://"):
        return endpoint  # a path on the server's machine: this one
    if not endpoint.startswith("tcp://"):
        raise ConfigError(f"--sglang {url}: kv_events_config.{field} {endpoint!r} is not a ZMQ endpoint")
    addr, sep, port = endpoint[len("tcp://"):].rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--sglang {url}: kv_events_config.{field} {endpoint!r} has no port")
    if subscriber_binds(endpoint) or addr == "0.0.0.0":  # the server binds: connect to its host
        return f"tcp://{f'[{host}]' if ':' in host else host}:{port}"
    raise ConfigError(f"--sglang {url}: the server connects out to {endpoint} (a concrete address is "
                      f"the subscriber's to bind): run attach there with --kv-events tcp://*:{port}")


__all__ = ["discover_sglang", "fetch_server_info", "sglang_pods"]
