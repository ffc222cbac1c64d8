"""``kvscope attach``: watch a vLLM / SGLang / kvscope deployment's KV cache.

    kvscope attach --kv-events tcp://10.0.0.5:5557 --replay tcp://10.0.0.5:5558 \\
                   --metrics http://10.0.0.5:8000/metrics --pod pod-a \\
                   --kv-events tcp://10.0.0.6:5557 --pod pod-b --tokenizer ./Llama-3.1-8B

    kvscope attach --sglang http://10.0.0.7:30000 --pod sglang-a

Each ``--kv-events`` or ``--sglang`` starts a pod; the ``--replay``, ``--topic``, ``--metrics``
and ``--pod`` after it belong to that pod. ``--sglang URL`` finds the server's ZMQ endpoint,
replay endpoint, topic, attention-DP ranks and /metrics in its ``/server_info``
(``engine.attach.discover``); options after it override what was found. Then the dashboard:
``KVSCOPE_URL=ws://127.0.0.1:8766 streamlit run dashboard``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from engine import envs


class _NewPod(argparse.Action):
    """Starts a pod: ``--kv-events ENDPOINT`` or ``--sglang URL`` (discovered)."""

    def __call__(self, parser, namespace, values, option_string=None):
        pods = list(getattr(namespace, "pods", None) or [])
        pods.append({"sglang" if option_string == "--sglang" else "endpoint": values})
        namespace.pods = pods


class _PodOption(argparse.Action):
    """Sets one key of the pod the latest ``--kv-events`` started."""

    def __call__(self, parser, namespace, values, option_string=None):
        pods = getattr(namespace, "pods", None) or []
        if not pods:
            parser.error(f"{option_string} belongs to a pod: give it after that pod's --kv-events")
        if self.dest in pods[-1]:
            start = (f"--sglang {pods[-1]['sglang']}" if "sglang" in pods[-1]
                     else f"--kv-events {pods[-1]['endpoint']}")
            parser.error(f"{option_string} given twice for the pod of {start} "
                         f"(start another pod with another --kv-events or --sglang)")
        pods[-1][self.dest] = values


def add_attach_subcommands(sub: Any) -> None:
    from engine.attach.server import DEFAULT_PORT
    from engine.server.commands import add_allowed_host_arg

    p = sub.add_parser("attach", help="watch a vLLM/SGLang deployment's KV cache events as a kvscope run",
                       description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    g = p.add_argument_group("pods (repeat --kv-events or --sglang per pod; options after it are that pod's)")
    g.add_argument("--kv-events", action=_NewPod, dest="pods", metavar="ENDPOINT",
                   help="the pod's KV event PUB endpoint, e.g. tcp://HOST:5557 (a tcp://*:PORT "
                        "endpoint is bound instead, for pods that connect out: on loopback only "
                        "unless --allow-remote)")
    g.add_argument("--sglang", action=_NewPod, dest="pods", metavar="URL",
                   help="an SGLang server's URL, e.g. http://HOST:30000: its KV event endpoint, replay, "
                        "topic, attention-DP ranks and /metrics are read from its /server_info")
    g.add_argument("--replay", action=_PodOption, metavar="ENDPOINT",
                   help="the pod's replay endpoint (its replay_endpoint), e.g. tcp://HOST:5558: fills gaps")
    g.add_argument("--topic", action=_PodOption, metavar="T", help="subscribe to this topic prefix only")
    g.add_argument("--metrics", action=_PodOption, metavar="URL",
                   help="the pod's Prometheus endpoint, scraped every second, e.g. http://HOST:8000/metrics")
    g.add_argument("--pod", action=_PodOption, metavar="NAME", help="the pod's name (default HOST:PORT)")
    g.add_argument("--data-parallel-size", action=_PodOption, dest="dp_size", metavar="N", type=int,
                   help="the pod runs N data-parallel ranks, rank r publishing (and replaying) on "
                        "PORT + r: follow each as pod NAME-dp{r} (its --metrics stays with rank 0)")
    p.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="tokenizer.json or a local model directory: block text and the prompt box")
    p.add_argument("--label", default=None, help="label of the recorded run")
    p.add_argument("--host", default="127.0.0.1", help="where the dashboard connects (default loopback)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"websocket port (default {DEFAULT_PORT})")
    p.add_argument("--db", default=None, help="runs database (default $KVSCOPE_DB or data/runs.sqlite)")
    p.add_argument("--no-record", dest="record", action="store_false", help="serve live only")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding beyond loopback (the websocket --host, and a tcp://*:PORT --kv-events)")
    add_allowed_host_arg(p)
    p.add_argument("--scrape-interval", type=float, default=1.0, metavar="S",
                   help="seconds between /metrics scrapes (default 1)")
    p.set_defaults(func=cmd_attach)


def options_from_args(args: argparse.Namespace) -> Any:
    """AttachOptions from parsed arguments; ConfigError / BindRefused when refused."""
    from engine.attach.server import AttachOptions
    from engine.core.errors import ConfigError
    from engine.attach.tokenizer_file import resolve_tokenizer_file

    if not args.pods:
        raise ConfigError("give at least one pod: --kv-events ENDPOINT or --sglang URL")
    pods = tuple(p for d in args.pods for p in _pod_sources(d))
    tokenizer = resolve_tokenizer_file(args.tokenizer) if args.tokenizer else None
    return AttachOptions(pods, host=args.host, port=args.port, db=args.db, record=args.record,
                         label=args.label, allow_remote=args.allow_remote,
                         token=envs.TOKEN.get(), tokenizer_file=tokenizer,
                         allowed_hosts=tuple(args.allowed_hosts),
                         scrape_interval_s=args.scrape_interval)


def _pod_sources(d: dict[str, Any]) -> list[Any]:
    """One ``--kv-events`` or ``--sglang`` pod's sources (one per data-parallel rank)."""
    from engine.attach.pod_source import PodSource, data_parallel_pods, default_pod_name

    if "sglang" in d:
        from engine.attach.discover import discover_sglang

        found = discover_sglang(d["sglang"], d.get("pod"))
        if not any(k in d for k in ("replay", "topic", "metrics", "dp_size")):
            return found
        first = found[0]  # rank 0 (named NAME-dp0 when the server has DP ranks): what was found
        base = PodSource(first.pod.removesuffix("-dp0") if len(found) > 1 else first.pod,
                         first.endpoint, d.get("replay", first.replay), d.get("topic", first.topic),
                         d.get("metrics", first.metrics))
        return data_parallel_pods(base, d.get("dp_size", len(found)))
    return data_parallel_pods(PodSource(d.get("pod") or default_pod_name(d["endpoint"]), d["endpoint"],
                                        d.get("replay"), d.get("topic") or "", d.get("metrics")),
                              d.get("dp_size", 1))


def cmd_attach(args: argparse.Namespace) -> int:
    from engine.attach.server import AttachServer
    from engine.core.errors import ConfigError
    from engine.server.port.security import BindRefused

    if not args.verbose:
        logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        opts = options_from_args(args)
    except (ConfigError, BindRefused, ValueError) as exc:
        print(f"kvscope attach: {exc}", file=sys.stderr)
        return 2
    server = AttachServer(opts)

    def announce() -> None:
        pods = ", ".join(f"{s.source.pod} <- {s.source.endpoint}" if s.bound is None
                         else f"{s.source.pod} <- pods connecting to {s.bound}" for s in server.subscriptions)
        print(f"kvscope: attached ({pods}); serving {server.url} (run {server.run_id}); "
              f"dashboard: KVSCOPE_URL={server.url} streamlit run dashboard", flush=True)

    server.on_bound = announce
    try:
        return server.serve_forever()
    except OSError as exc:
        print(f"kvscope attach: {exc}", file=sys.stderr)
        return 2
