"""The ``kvscope`` command: generate, serve, submit, attach, simulate, runs, replay, lesson, bench.

Each subsystem registers its own subcommands; heavy imports (torch, the model)
happen only inside the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from engine.core.sampling_params import add_sampling_args
from engine.engine_args import add_engine_args, engine_kwargs


def cmd_generate(args: argparse.Namespace) -> int:
    from engine import LLM, SamplingParams
    from engine.core.sampling_params import sampling_args

    llm = LLM(**engine_kwargs(args))
    params = SamplingParams(**sampling_args(args))
    if args.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
    else:
        outs = llm.generate(args.prompts, params)
    for o in outs:
        for c in o.outputs:
            label = o.request_id if len(o.outputs) == 1 else f"{o.request_id}[{c.index}]"
            print(f"--- {label} ({c.finish_reason}, {o.num_cached_tokens} cached prompt tokens)")
            print(c.text)
    print(json.dumps(llm.stats(), indent=None), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscope", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text offline and print it")
    add_engine_args(g)
    g.add_argument("prompts", nargs="+")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user chat message")
    add_sampling_args(g, seed_flag="--sampling-seed")
    g.set_defaults(func=cmd_generate)

    # Imported here, not at the top: each subsystem's commands module is light, but
    # bench's package sets the OpenMP wait policy when imported (bench/__init__.py)
    from bench.commands import add_bench_subcommands
    from engine.attach.commands import add_attach_subcommands
    from engine.client.commands import add_client_subcommands
    from engine.server.commands import add_server_subcommands
    from engine.simulate.commands import add_simulate_subcommands
    from engine.store.commands import add_store_subcommands
    from lessons.commands import add_lesson_subcommands

    for add in (add_store_subcommands, add_server_subcommands, add_client_subcommands,
                add_attach_subcommands, add_simulate_subcommands, add_lesson_subcommands,
                add_bench_subcommands):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.cpu_threads import set_default_wait_policy

    set_default_wait_policy()  # before any command imports torch (libgomp reads it once)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
