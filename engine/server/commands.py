"""``kvscope serve`` (engine.cli registers it via add_server_subcommands; ``kvscope submit``
is a client: engine.client.commands).

Imports stay light here: the CLI builds its parser for every command, so the
server (torch, the model) is imported only inside ``cmd_serve``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import textwrap

from engine import envs
from engine.engine_args import add_engine_args, engine_kwargs
from engine.server.api.client_quota import DEFAULT_MAX_API_IN_FLIGHT
from engine.server.websocket.frame_rate import BYTES_PER_S, FRAME_BURST, FRAMES_PER_S

# Where serve's engine defaults differ from the library's (EngineConfig), and why; the one
# list, printed at every start (``serve_differences``). A server is shared: no client
# starves another, nor sets another's pace, nor holds the engine's GIL.
SERVE_DEFAULTS: dict[str, tuple[object, str]] = {
    "scheduling_policy": ("fair", "each client at work gets an equal part of every step"),
    # a heavy client takes at most twice the lightest client's part of a step (bench/RESULTS.md,
    # "Soak": the ratio against good clients' p99 and what a flood got done)
    "fair_ratio": (2, "a client's part of a step is at most 2x what the lightest client could use"),
    "engine_core_process": (True, "the engine core runs in a process of its own "
                                  "(--engine-core-in-process keeps it in the server's)"),
}


def serve_differences(cfg) -> list[str]:
    """``name=value (why)`` for each of serve's defaults that differs from the library's and
    is in effect in ``cfg``."""
    return [f"{name}={value!r} ({why})" for name, (value, why) in SERVE_DEFAULTS.items()
            if getattr(cfg, name) == value]


def add_allowed_host_arg(g) -> None:
    """``--allowed-host`` (serve and attach): Host names answered besides loopback ones."""
    g.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header is NAME (repeatable; .example.com "
                        "allows the domain and its subdomains). On loopback only loopback names are "
                        "answered by default (DNS rebinding); on another address this list, when "
                        "given, is enforced too")


def add_server_subcommands(sub: argparse._SubParsersAction) -> None:
    """``kvscope serve``."""
    p = sub.add_parser("serve", help="run one live engine behind a websocket and OpenAI API server",
                       description=textwrap.fill("Run one engine and stream its events over websockets "
                                                 "(protocol v2), with the OpenAI API (/v1/models, "
                                                 "/v1/completions, /v1/chat/completions), /healthz and "
                                                 "/metrics on the same port.", 88),
                       epilog=envs.help_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.set_defaults(**{name: value for name, (value, _) in SERVE_DEFAULTS.items()})
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help=f"bind address; anything but loopback needs --allow-remote and {envs.TOKEN.name}")
    g.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed on start)")
    g.add_argument("--db", default=None, help="SQLite file for the recording (default $KVSCOPE_DB "
                                              "or data/runs.sqlite)")
    g.add_argument("--no-record", dest="record", action="store_false", help="do not record the run")
    g.add_argument("--label", default=None, help="label of the recorded run")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model name(s) the API answers to, as in vLLM; the first one is the "
                        "model_name label of /metrics (default: --model)")
    g.add_argument("--allow-remote", action="store_true",
                   help=f"allow a non-loopback --host (clients must present {envs.TOKEN.name})")
    add_allowed_host_arg(g)
    g.add_argument("--max-queue", type=int, default=256,
                   help="bound of the engine's waiting queue (0 = unbounded); more gives queue_full")
    g.add_argument("--max-frame-bytes", type=int, default=1 << 20,
                   help="largest client frame answered; 4x this closes the connection (1009)")
    g.add_argument("--max-in-flight", dest="max_in_flight_per_conn", type=int, default=64,
                   help="live requests per connection")
    g.add_argument("--max-frames-per-s", type=float, default=FRAMES_PER_S, metavar="N",
                   help="frames a websocket connection may send per second, after a burst of "
                        f"{FRAME_BURST}; past it the server reads that connection no faster "
                        "(nothing is refused; 0 = no bound; default %(default)s)")
    g.add_argument("--max-inbound-bytes-per-s", type=float, default=BYTES_PER_S, metavar="N",
                   help="bytes a websocket connection may send per second, after a burst of two "
                        "--max-frame-bytes frames (at least 4 MiB); 0 = no bound (default 8 MiB)")
    g.add_argument("--max-api-in-flight", type=int, default=DEFAULT_MAX_API_IN_FLIGHT, metavar="N",
                   help="live generation requests (one per prompt) per client address over the "
                        "OpenAI API; past it a call gets 429 too_many_in_flight "
                        f"(default {DEFAULT_MAX_API_IN_FLIGHT})")
    g.add_argument("--no-client-restart", dest="client_restart", action="store_false",
                   help="refuse clients' restart op (restart_disabled); restarts are bounded by "
                        "the started pool and scheduler anyway")
    g.add_argument("--redact-tokens", action="store_true",
                   help="events, steps_since and snapshots carry ids and counts but no token ids "
                        "(each submitter still gets its own outputs); without it every watcher "
                        "sees every request's token ids")
    g.add_argument("--max-outbox-bytes", type=int, default=64 << 20,
                   help="unsent bytes per connection before it is closed as not reading (1008)")
    g.add_argument("--step-buffer", type=int, default=256,
                   help="unsent step messages per client before they are dropped (client resyncs)")
    g.add_argument("--engine-core-in-process", dest="engine_core_process", action="store_false",
                   help="run the engine core (scheduler, model) in the server's process instead of "
                        "a process of its own (the default; in one process every forward shares "
                        "the GIL with every client's frames: bench/RESULTS.md, 'Soak')")
    g.add_argument("--kv-events-config", default=None, metavar="JSON",
                   help="publish KV cache events in vLLM's format, e.g. '{\"enable_kv_cache_events\": "
                        "true, \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}' "
                        "(vLLM's fields; \"encoding\": \"array\" for vLLM <= 0.23 / SGLang consumers)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.config import EngineConfig
    from engine.core import KVScopeError
    from engine.kv_events.config import KVEventsConfig
    from engine.server.app import KVScopeServer, ServerOptions
    from engine.server.port.security import BindRefused

    if not args.verbose:  # websockets logs every connection and HTTP response at INFO
        for name in ("websockets", "uvicorn", "uvicorn.error"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        kw = engine_kwargs(args)  # kv_events_config comes in as the JSON text
        kw["kv_events_config"] = KVEventsConfig.coerce(args.kv_events_config)
        if kw["num_threads"] is None:  # KVSCOPE_SERVE_THREADS, if set; else the governed default
            from engine.cpu_threads import serving_count

            kw["num_threads"] = serving_count()
        cfg = EngineConfig(**kw, max_waiting=args.max_queue)
        # the server group's flags are named as ServerOptions' fields (None: its default)
        opts = ServerOptions(cfg, token=envs.TOKEN.get(), **{
            f.name: v for f in dataclasses.fields(ServerOptions)
            if (v := getattr(args, f.name, None)) is not None})
    except (BindRefused, KVScopeError, ValueError) as exc:
        print(f"kvscope serve: {exc}", file=sys.stderr)
        return 2
    server = KVScopeServer(opts)

    def announce() -> None:
        print(f"kvscope: serving {server.url} (OpenAI API at {server.http_url}; model {cfg.model} "
              f"loading; GET /healthz for status)", flush=True)
        for line in serve_differences(cfg):
            print(f"kvscope: serve's default, not the library's: {line}", flush=True)

    server.on_bound = announce
    try:
        return server.serve_forever()
    except OSError as exc:  # e.g. the port is taken
        print(f"kvscope serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
