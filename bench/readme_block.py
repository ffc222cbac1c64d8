"""The README's benchmark paragraph, generated from ``bench/results_cpu.json`` (and
``bench/results_vllm.json`` and ``results_vllm_bfloat16.json``, ``kvscope bench --baseline
vllm``'s in float32 and with ``--dtype bfloat16``, where they exist).

The figures in README.md sit between two markers and are rewritten from the JSON by
``kvscope bench --update-readme`` (and after every full ``kvscope bench``), so they
cannot drift from RESULTS.md: tests/bench/test_readme_block.py checks the README's
block equals what this makes of the committed JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.measure import cpu_label
from bench.vllm_compare import JSON as VLLM_JSON, JSON_BF16 as VLLM_BF16_JSON  # each comparison's own file
from bench.vllm_compare import JSON_DEFAULTS as VLLM_DEFAULTS_JSON

BEGIN = "<!-- bench-summary:begin (generated from bench/results_cpu.json by `kvscope bench --update-readme`) -->"
END = "<!-- bench-summary:end -->"
ROOT = Path(__file__).resolve().parent.parent
JSON = ROOT / "bench" / "results_cpu.json"
README = ROOT / "README.md"


def _target(results: dict, prefix: str, key: str = "value") -> float | None:
    return next((t.get(key) for t in results.get("targets", [])
                 if t["target"].startswith(prefix)), None)


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def render(results: dict) -> str:
    """The paragraph, every figure from ``results`` (the JSON ``kvscope bench`` writes)."""
    m, c = results["machine"], results["config"]
    w = results["workloads"]
    mixed, shared = w.get("mixed", {}), w.get("shared_prefix", {})
    threads = f"{m['torch_threads']} torch thread{'s' if m['torch_threads'] != 1 else ''}"
    if m.get("omp_wait_policy"):
        threads += f" ({m['omp_wait_policy']})"
    roof = ""
    b64, b1 = _target(results, "roofline: 64-sequence"), _target(results, "roofline: 1-sequence")
    if b64 is not None or b1 is not None:
        c64 = _target(results, "roofline: 64-sequence", "value_cpu_time")
        c1 = _target(results, "roofline: 1-sequence", "value_cpu_time")
        roof = (f" Roofline (wall clock; by CPU time in brackets): 64-sequence decode at "
                f"{_pct(b64)} ({_pct(c64)}) of the measured GEMM ceiling, 1-sequence decode at "
                f"{_pct(b1)} ({_pct(c1)}) of the fp32 weight-streaming limit.")
    return (
        f"On {cpu_label(m)} (`kvscope bench`, run of {m['date']}, "
        f"{c['model']} float32, {threads}, same process for both "
        "systems, greedy tokens identical): kvscope's throughput is "
        f"{_x(_target(results, 'mixed: throughput'))} transformers' static batching on "
        f"{mixed.get('num_requests', '?')} chat-like requests and "
        f"{_x(_target(results, 'shared prefix: throughput'))} on "
        f"{shared.get('num_requests', '?')} requests sharing a system prompt "
        f"({_pct(_target(results, 'shared prefix: shared prompt'))} of it served from the "
        "prefix cache); chunked prefill cuts the short requests' TTFT behind a long prompt "
        f"to {_x(_target(results, 'long+short'))}; streaming + recording every event costs "
        f"{_pct(_target(results, 'events:'))}.{roof}")


def render_vllm(res: dict) -> str:
    """The row against vLLM's CPU build, every figure from its JSON (float32 or bfloat16)."""
    o = res["options"]
    ratios = ", ".join(f"{_x(r['ratio'])} at concurrency {r['concurrency']}" for r in res["rows"])
    if o.get("engine_defaults"):
        used = res.get("threads", {})
        return (f"With each engine at its own thread default (`kvscope bench --baseline vllm --engine-defaults`, "
                f"run of {res['machine']['date']} on {cpu_label(res['machine'])}, {o['dtype']}: vLLM "
                f"{used.get('vllm', '?')} OpenMP thread(s), as its VLLM_CPU_OMP_THREADS_BIND=auto leaves after "
                f"reserving a core for its front end; kvscope {used.get('kvscope', '?')}), kvscope's output "
                f"throughput is {ratios}.")
    if o.get("dtype", "float32") != "float32":
        return (f"In {o['dtype']} on both sides (vLLM's own default for this float32 model on an x86 CPU; "
                f"`kvscope bench --baseline vllm --dtype {o['dtype']}`, run of {res['machine']['date']} on "
                f"{cpu_label(res['machine'])}, the same requests and threads), kvscope's output "
                f"throughput is {ratios}.")
    return (f"Against vLLM's own CPU build ({res['vllm']}, `kvscope bench --baseline vllm`, run of "
            f"{res['machine']['date']} on {cpu_label(res['machine'])}, "
            f"{o['threads']} CPU thread{'s' if o['threads'] != 1 else ''} "
            f"each, through both OpenAI servers, prompts of {o['prompt_tokens']} tokens and "
            f"{o['output_tokens']} output tokens, outputs "
            + ("token-identical" if res["outputs_identical"] else "not identical")
            + f"), kvscope's output throughput is {ratios}.")


def block(results: dict, vllm: dict | None = None, vllm_bf16: dict | None = None,
          vllm_defaults: dict | None = None) -> str:
    text = render(results) + "".join("\n\n" + render_vllm(v) for v in (vllm, vllm_defaults, vllm_bf16) if v)
    return f"{BEGIN}\n{text}\n{END}"


def _vllm_results(path: Path = VLLM_JSON) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def readme_block(text: str) -> str | None:
    """The generated block as it stands in ``text`` (None without both markers)."""
    if BEGIN not in text or END not in text:
        return None
    return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END


def update_readme(json_path: Path = JSON, readme: Path = README, vllm_json: Path = VLLM_JSON,
                  vllm_bf16_json: Path = VLLM_BF16_JSON, vllm_defaults_json: Path = VLLM_DEFAULTS_JSON) -> bool:
    """Rewrite the README's block from the JSON (and the vLLM comparisons', where they
    exist); True when the text changed."""
    text = readme.read_text()
    old = readme_block(text)
    if old is None:
        raise ValueError(f"{readme} has no {BEGIN!r} ... {END!r} block")
    new = block(json.loads(Path(json_path).read_text()), _vllm_results(Path(vllm_json)),
                _vllm_results(Path(vllm_bf16_json)), _vllm_results(Path(vllm_defaults_json)))
    readme.write_text(text.replace(old, new))
    return old != new
