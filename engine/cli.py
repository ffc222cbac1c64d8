"""The ``kvscope`` command: generate, serve, submit, attach, runs, replay, lesson, bench.

Each subsystem registers its own subcommands; heavy imports (torch, the model)
happen only inside the command that needs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from engine.core.sampling_params import CLI_TEMPERATURE_HELP


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine options shared by every command that starts an engine."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a local HF dir or a .gguf file")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None, help="pool size in blocks")
    g.add_argument("--kv-cache-memory", type=int, default=None, help="KV budget in bytes")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--n-sharing", default="cow", choices=["cow", "prefix_cache"],
                   help="how n > 1 samples share KV blocks: cow = copy-on-write forks "
                   "(paper / vLLM v0), prefix_cache = child requests sharing full prompt "
                   "blocks through the prefix cache (vLLM v1)")
    g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "fair"],
                   help="fcfs = vLLM's arrival order; fair = each client's k-th request before "
                   "anyone's (k+1)-th, preempting the client holding the most sequences when "
                   "another cannot get a seat (serve's default; with one client it is fcfs)")
    g.add_argument("--fair-ratio", type=int, default=0, metavar="R",
                   help="fair only: no client takes more than R times the sequences (and tokens) "
                   "of a step that the lightest client at work could use, so a heavy client "
                   "cannot set a light one's pace (0 = off; serve's default: 2)")
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="auto",
                   help="auto, float32, bfloat16 (on the CPU: bf16 weights, float32 compute), float16")
    g.add_argument("--quantization", default=None, choices=["int8"],
                   help="int8: weight-only int8 linears with float32 compute (CPU; not the default)")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--num-threads", type=int, default=None,
                   help="CPU torch threads (default: every usable core, or $KVSCOPE_NUM_THREADS; "
                   "serve: $KVSCOPE_SERVE_THREADS; see engine/cpu_threads.py)")
    g.add_argument("--seed", type=int, default=0)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineConfig fields the parsed arguments set (``add_engine_args`` names each
    option after its field, so the config's own field list is the one key list)."""
    from engine.config import EngineConfig

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
            if hasattr(args, f.name)}


def cmd_generate(args: argparse.Namespace) -> int:
    from engine import LLM, SamplingParams
    from engine.core.sampling_params import cli_temperature

    llm = LLM(**engine_kwargs(args))
    params = SamplingParams(temperature=cli_temperature(args.temperature, args.n), top_p=args.top_p,
                            max_tokens=args.max_tokens,
                            n=args.n, seed=args.sampling_seed, stop=args.stop or [])
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
    g.add_argument("--temperature", type=float, default=None,
                   help=CLI_TEMPERATURE_HELP)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--n", type=int, default=1)
    g.add_argument("--sampling-seed", type=int, default=None)
    g.add_argument("--stop", action="append")
    g.set_defaults(func=cmd_generate)

    for module, fn in (("engine.store.commands", "add_store_subcommands"),
                       ("engine.server.commands", "add_server_subcommands"),
                       ("engine.client.commands", "add_client_subcommands"),
                       ("engine.attach.commands", "add_attach_subcommands"),
                       ("lessons.commands", "add_lesson_subcommands"),
                       ("bench.commands", "add_bench_subcommands")):
        try:
            mod = __import__(module, fromlist=[fn])
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # that subsystem is not in this checkout yet
            raise
        getattr(mod, fn)(sub)
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
