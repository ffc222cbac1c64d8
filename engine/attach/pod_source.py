"""PodSource: where one pod of a deployment publishes, as ``kvscope attach`` was told.

``endpoint`` is the pod's KV event PUB socket (``--kv-events``); attach connects to
it, or binds it when it is a wildcard (``tcp://*:PORT``, ``tcp://[::]:PORT``): then the
pods connect out to attach, as to llm-d's router (``subscriber_binds``). A wildcard binds
loopback only (``tcp://127.0.0.1:PORT``) unless ``--allow-remote``, as ``kvscope serve``
keeps its KV event sockets to this machine (``bind_endpoint``). ``replay`` is its replay ROUTER (``replay_endpoint``
in the pod's ``--kv-events-config``), ``topic`` the prefix to subscribe to,
``metrics`` its Prometheus URL. ``pod`` names it in the run. A data-parallel deployment is one
pod per rank (``data_parallel_pods``: rank r publishes on port + r, vLLM's and SGLang's rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.core.errors import ConfigError

ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class PodSource:
    pod: str
    endpoint: str
    replay: str | None = None
    topic: str = ""
    metrics: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pod, str) or not self.pod.strip() or len(self.pod) > 128:
            raise ConfigError(f"a pod name is 1..128 characters, got {self.pod!r}")
        for name in ("endpoint", "replay"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and v.startswith(ZMQ_SCHEMES)
                                      and len(v) > len("tcp://")):
                raise ConfigError(f"pod {self.pod!r}: --{'kv-events' if name == 'endpoint' else name} "
                                  f"must be a ZMQ endpoint such as tcp://HOST:5557, got {v!r}")
        if self.metrics is not None:
            parts = urlsplit(self.metrics)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(f"pod {self.pod!r}: --metrics must be an http(s) URL such as "
                                  f"http://HOST:8000/metrics, got {self.metrics!r}")

    def to_dict(self) -> dict[str, str | None]:
        return {"pod": self.pod, "endpoint": self.endpoint, "replay": self.replay,
                "topic": self.topic, "metrics": self.metrics}


def subscriber_binds(endpoint: str) -> bool:
    """Whether the subscriber binds ``endpoint``: the mirror of vLLM's publisher rule.

    A publisher binds wildcards, ipc and inproc, and connects to anything else. So an
    ipc or a concrete tcp address is the publisher's: connect to it. A wildcard is an
    address to listen on: bind it, and let publishers configured with this host's
    address connect."""
    return "*" in endpoint or "::" in endpoint


def bind_endpoint(endpoint: str, allow_remote: bool) -> str:
    """The address a subscriber that binds ``endpoint`` listens on: every interface with
    ``allow_remote``, else loopback only (the wildcard's host becomes 127.0.0.1, ``[::]``'s
    ``[::1]``). Pods that connect out then have to run on this machine, or be let in with
    ``--allow-remote``: the stream carries prompt token ids and ZMQ authenticates no one."""
    if allow_remote or not endpoint.startswith("tcp://"):
        return endpoint
    host, sep, port = endpoint[len("tcp://"):].rpartition(":")
    if host == "*":
        return f"tcp://127.0.0.1:{port}"
    if host in ("[::]", "::"):
        return f"tcp://[::1]:{port}"
    return endpoint


def default_pod_name(endpoint: str) -> str:
    """``tcp://10.0.0.5:5557`` → ``10.0.0.5:5557``: what a pod is called without ``--pod``."""
    for scheme in ZMQ_SCHEMES:
        if endpoint.startswith(scheme):
            return endpoint[len(scheme):]
    return endpoint


def dp_rank_endpoint(endpoint: str, rank: int) -> str:
    """Where data-parallel rank ``rank`` of a pod publishes: vLLM's rule (its
    ``offset_endpoint_port``): a tcp port + rank, an inproc name + ``_dp{rank}``. SGLang's
    attention-DP ranks follow the same port rule. An ipc path has no rank rule: ConfigError."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    host, sep, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not port.isdigit():
        raise ConfigError(f"--data-parallel-size needs tcp://HOST:PORT endpoints (rank r publishes "
                          f"on PORT + r), got {endpoint!r}")
    if int(port) + rank > 65535:
        raise ConfigError(f"rank {rank} of {endpoint} would publish past port 65535")
    return f"{host}:{int(port) + rank}"


def data_parallel_pods(source: PodSource, size: int) -> list[PodSource]:
    """One pod per data-parallel rank: ``NAME-dp{r}`` on the endpoints of rank r. The pod's
    ``/metrics`` (vLLM serves every rank's on one API server) stays with rank 0."""
    if not isinstance(size, int) or size < 1:
        raise ConfigError(f"--data-parallel-size must be >= 1, got {size!r}")
    if size == 1:
        return [source]
    return [PodSource(f"{source.pod}-dp{r}", dp_rank_endpoint(source.endpoint, r),
                      None if source.replay is None else dp_rank_endpoint(source.replay, r),
                      source.topic, source.metrics if r == 0 else None)
            for r in range(size)]
