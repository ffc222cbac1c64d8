"""Generate traces in Mooncake's FAST'25 format (``{"timestamp", "input_length",
"output_length", "hash_ids"}``, 512-token blocks) with a conversation workload's shape.

Sessions of several turns arrive as a Poisson process. A session opens with one of a few
shared system prompts (blocks every session with it shares), and each next turn's prompt
is the previous prompt, the previous answer and a new user message: the turn re-sends
its history, as a chat client does, so its first blocks repeat the previous turn's hash
ids. New text gets new hash ids. ``stats`` measures what a trace has (mean lengths,
the share of blocks whose hash id came before), so a generated trace can be checked
against the statistics it imitates (the published conversation trace: 12,031 requests
in an hour, mean input 12,035 tokens, mean output 343).

    python -m engine.simulate.mooncake --requests 200 --mean-input 2000 --out data/traces/x.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from typing import Any, Iterable

from engine.simulate.trace import MOONCAKE_BLOCK


@dataclass(frozen=True)
class Shape:
    num_requests: int = 12_000
    duration_s: float = 3600.0
    mean_input: int = 12_000  # tokens, over every turn
    mean_output: int = 343
    mean_turns: float = 1.3  # turns per session (1 + geometric)
    system_prompts: int = 8
    system_blocks: int = 2  # blocks of each shared system prompt
    seed: int = 0
    scale: float = 1.0  # new text per turn, relative to the first guess (``calibrate`` sets it)


def generate(shape: Shape) -> list[dict[str, Any]]:
    """Records in arrival order. Turn t of a session has about ``t`` times a first turn's
    new text; the first turn's size is chosen so the mean input comes out at
    ``mean_input`` (first-turn text ~ mean_input / mean of (1 + 2 + ... + turns) scaled)."""
    rng = random.Random(shape.seed)
    next_id = [shape.system_prompts * shape.system_blocks]
    systems = [list(range(k * shape.system_blocks, (k + 1) * shape.system_blocks))
               for k in range(shape.system_prompts)]

    def extend(ids: list[int], length: int, n: int) -> list[int]:
        """The ids of a history of ``length`` tokens grown by ``n``: its whole blocks keep
        their ids; the partial last block, now with other tokens, and the rest get new ones."""
        keep = length // MOONCAKE_BLOCK
        k = -(-(length + n) // MOONCAKE_BLOCK) - keep
        out = ids[:keep] + list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return out

    # a session of T turns re-sends its history: turn t's input ~ sys + t * (user + answer)
    mean_t = shape.mean_turns
    sys_tokens = shape.system_blocks * MOONCAKE_BLOCK
    per_turn = max(64, int(shape.scale * ((shape.mean_input - sys_tokens) / ((mean_t + 1) / 2)
                                          - shape.mean_output)))
    rate = shape.num_requests / shape.duration_s
    records: list[tuple[float, dict[str, Any]]] = []
    t = 0.0
    while len(records) < shape.num_requests:
        t += rng.expovariate(rate / mean_t)
        turns = 1
        while rng.random() > 1 / mean_t:  # 1 + geometric: mean mean_t
            turns += 1
        ids = list(rng.choice(systems))
        length = sys_tokens
        when = t
        for _turn in range(turns):
            user = max(16, int(rng.expovariate(1 / per_turn)))
            ids = extend(ids, length, user)
            length += user
            out = max(1, int(rng.expovariate(1 / shape.mean_output)))
            records.append((when, {"timestamp": int(when * 1000), "input_length": length,
                                   "output_length": out, "hash_ids": list(ids)}))
            ids = extend(ids, length, out)  # the answer joins the history
            length += out
            when += rng.expovariate(1 / 30.0)  # the user reads, then writes the next turn
    records.sort(key=lambda r: r[0])
    return [r for _, r in records[: shape.num_requests]]


def calibrate(shape: Shape, reuse: float, rounds: int = 6) -> Shape:
    """The shape whose traces have ``shape.mean_input`` and a reusable block share near
    ``reuse``: more turns per session reuse more; the text per turn is rescaled after."""
    import dataclasses

    lo, hi = 1.0, 8.0
    probe = shape
    for _ in range(rounds):
        mid = (lo + hi) / 2
        s = stats(generate(dataclasses.replace(probe, mean_turns=mid)))
        lo, hi = (mid, hi) if s["reusable_block_share"] < reuse else (lo, mid)
    out = dataclasses.replace(shape, mean_turns=(lo + hi) / 2)
    for _ in range(3):
        s = stats(generate(dataclasses.replace(out, num_requests=probe.num_requests)))
        out = dataclasses.replace(out, scale=out.scale * shape.mean_input / s["mean_input"])
    return out


def stats(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Requests, mean input / output tokens, prompt tokens, and the share of blocks whose
    hash id appeared in an earlier request (reusable with an infinite cache)."""
    seen: set[int] = set()
    n = inp = out = blocks = reused = 0
    for r in records:
        n += 1
        inp += r["input_length"]
        out += r["output_length"]
        for h in r["hash_ids"]:
            blocks += 1
            reused += h in seen
        seen.update(r["hash_ids"])
    return {"requests": n, "mean_input": inp / n if n else 0.0, "mean_output": out / n if n else 0.0,
            "prompt_tokens": inp, "reusable_block_share": reused / blocks if blocks else 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in Shape.__dataclass_fields__.values():
        p.add_argument("--" + f.name.replace("_", "-").replace("num-", ""), dest=f.name,
                       type=type(f.default), default=f.default)
    p.add_argument("--reuse", type=float, default=None,
                   help="calibrate turns per session to this reusable block share (e.g. 0.37)")
    p.add_argument("--out", default="-")
    a = p.parse_args(argv)
    shape = Shape(**{k: getattr(a, k) for k in Shape.__dataclass_fields__})
    if a.reuse is not None:
        shape = calibrate(shape, a.reuse)
        print(json.dumps({"mean_turns": shape.mean_turns, "scale": shape.scale}), file=sys.stderr)
    records = generate(shape)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)
    print(json.dumps(stats(records)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
