"""``kvscope submit`` (engine.cli registers it via add_client_subcommands).

Imports stay light here: the CLI builds its parser for every command.
"""

from __future__ import annotations

import argparse
import sys

from engine import envs
from engine.core.sampling_params import add_sampling_args, sampling_args


def add_client_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="send one prompt to a running server and stream the answer")
    p.add_argument("prompt")
    p.add_argument("--url", default="ws://127.0.0.1:8765")
    p.add_argument("--token", default=None, help=f"server token (default ${envs.TOKEN.name})")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    add_sampling_args(p)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a starting server")
    p.add_argument("--json", action="store_true", help="print the finished message as JSON")
    p.set_defaults(func=cmd_submit)


def cmd_submit(args: argparse.Namespace) -> int:
    from engine.client import KVScopeClient, ServerError
    from engine.protocol import Finished, Output, encode
    from engine.store.commands import fmt_figure

    params = sampling_args(args)
    kwargs = ({"messages": [{"role": "user", "content": args.prompt}]} if args.chat
              else {"prompt": args.prompt})
    client = KVScopeClient(args.url, token=args.token or envs.TOKEN.get())
    try:
        client.connect(wait=args.wait)
        rid = client.submit(params=params, **kwargs)
        finished: Finished | None = None
        if args.n > 1 and not args.json:  # every sample gets a header, sample 0 too
            print("--- sample 0", flush=True)
        for msg in client.stream(rid):
            if isinstance(msg, Output) and msg.index == 0 and not args.json:
                sys.stdout.write(msg.text_delta)
                sys.stdout.flush()
            elif isinstance(msg, Finished):
                finished = msg
    except (ServerError, OSError, TimeoutError) as exc:
        print(f"\nkvscope submit: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.json:
        print(encode(finished))
        return 0
    print()
    for out in finished.outputs[1:]:
        print(f"--- sample {out['index']}\n{out['text']}")
    m = finished.metrics
    reasons = ",".join(str(o["finish_reason"]) for o in finished.outputs)
    print(f"--- {rid}: finish={reasons} prompt_tokens={m.get('num_prompt_tokens')} "
          f"cached_tokens={m.get('num_cached_tokens')} output_tokens={m.get('num_output_tokens')} "
          f"ttft={fmt_figure(m.get('ttft'), 's')} e2e={fmt_figure(m.get('e2e'), 's')}")
    return 0
