"""``kvscope serve`` and ``kvscope submit`` (engine.cli registers them via add_server_subcommands).

Imports stay light here: the CLI builds its parser for every command, so the
server (torch, the model) is imported only inside ``cmd_serve``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from engine.server.security import TOKEN_ENV


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from engine.cli import add_engine_args

    p = sub.add_parser("serve", help="run one live engine behind a websocket server",
                       description="Run one engine and stream its events over websockets "
                                   "(protocol v1), with /healthz and /metrics on the same port.")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help=f"bind address; anything but loopback needs --allow-remote and {TOKEN_ENV}")
    g.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed on start)")
    g.add_argument("--db", default=None, help="SQLite file for the recording (default $KVSCOPE_DB "
                                              "or data/runs.sqlite)")
    g.add_argument("--no-record", dest="record", action="store_false", help="do not record the run")
    g.add_argument("--label", default=None, help="label of the recorded run")
    g.add_argument("--allow-remote", action="store_true",
                   help=f"allow a non-loopback --host (clients must present {TOKEN_ENV})")
    g.add_argument("--max-queue", type=int, default=256,
                   help="bound of the engine's waiting queue (0 = unbounded); more gives queue_full")
    g.add_argument("--max-frame-bytes", type=int, default=1 << 20,
                   help="largest client frame answered; 4x this closes the connection (1009)")
    g.add_argument("--max-in-flight", type=int, default=64, help="live requests per connection")
    g.add_argument("--step-buffer", type=int, default=256,
                   help="unsent step messages per client before they are dropped (client resyncs)")
    p.set_defaults(func=cmd_serve)


def _add_submit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="send one prompt to a running server and stream the answer")
    p.add_argument("prompt")
    p.add_argument("--url", default="ws://127.0.0.1:8765")
    p.add_argument("--token", default=None, help=f"server token (default ${TOKEN_ENV})")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a starting server")
    p.add_argument("--json", action="store_true", help="print the finished message as JSON")
    p.set_defaults(func=cmd_submit)


def add_server_subcommands(sub: argparse._SubParsersAction) -> None:
    _add_serve(sub)
    _add_submit(sub)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.cli import engine_kwargs
    from engine.config import EngineConfig
    from engine.core import KVScopeError
    from engine.server.app import KVScopeServer, ServerOptions
    from engine.server.security import BindRefused

    if not args.verbose:  # websockets logs every connection and HTTP response at INFO
        logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        kw = engine_kwargs(args)
        if kw["num_threads"] is None:  # the serving default (it shares the box with the dashboard)
            from engine.cpu_threads import thread_count

            kw["num_threads"] = thread_count(serving=True)
        cfg = EngineConfig(**kw, max_waiting=args.max_queue)
        opts = ServerOptions(cfg, host=args.host, port=args.port, db=args.db, record=args.record,
                             label=args.label, allow_remote=args.allow_remote,
                             token=os.environ.get(TOKEN_ENV) or None,
                             max_frame_bytes=args.max_frame_bytes,
                             max_in_flight_per_conn=args.max_in_flight, step_buffer=args.step_buffer)
    except (BindRefused, KVScopeError, ValueError) as exc:
        print(f"kvscope serve: {exc}", file=sys.stderr)
        return 2
    server = KVScopeServer(opts)

    def announce() -> None:
        print(f"kvscope: serving {server.url} (model {cfg.model} loading; GET /healthz for status)",
              flush=True)

    server.on_bound = announce
    try:
        return server.serve_forever()
    except OSError as exc:  # e.g. the port is taken
        print(f"kvscope serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1


def _figure(v: object, unit: str = "") -> str:
    return "-" if v is None else (f"{v:.3f}{unit}" if isinstance(v, float) else f"{v}{unit}")


def cmd_submit(args: argparse.Namespace) -> int:
    from engine.server.client import KVScopeClient, ServerError

    params = {"n": args.n, "temperature": args.temperature, "top_p": args.top_p,
              "max_tokens": args.max_tokens, "seed": args.seed, "stop": args.stop or []}
    kwargs = ({"messages": [{"role": "user", "content": args.prompt}]} if args.chat
              else {"prompt": args.prompt})
    client = KVScopeClient(args.url, token=args.token or os.environ.get(TOKEN_ENV))
    try:
        client.connect(wait=args.wait)
        rid = client.submit(params=params, **kwargs)
        finished: dict = {}
        for msg in client.stream(rid):
            if msg["type"] == "output" and msg["index"] == 0 and not args.json:
                sys.stdout.write(msg["text_delta"])
                sys.stdout.flush()
            finished = msg
    except (ServerError, OSError, TimeoutError) as exc:
        print(f"\nkvscope submit: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.json:
        print(json.dumps(finished))
        return 0
    print()
    for out in finished["outputs"][1:]:
        print(f"--- sample {out['index']}\n{out['text']}")
    m = finished["metrics"]
    reasons = ",".join(str(o["finish_reason"]) for o in finished["outputs"])
    print(f"--- {rid}: finish={reasons} prompt_tokens={m.get('num_prompt_tokens')} "
          f"cached_tokens={m.get('num_cached_tokens')} output_tokens={m.get('num_output_tokens')} "
          f"ttft={_figure(m.get('ttft'), 's')} e2e={_figure(m.get('e2e'), 's')}")
    return 0
