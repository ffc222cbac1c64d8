"""One long prompt plus two short ones under chunked prefill.

The long prompt is cut into chunks of at most ``max_num_batched_tokens``; the
short requests are admitted alongside and get their first token long before
the long prompt is done.

    python examples/chunked_prefill.py
"""

from engine import LLM, SamplingParams

long_prompt = "Summarize the following notes.\n" + "\n".join(
    f"Note {i}: the block table maps logical block {i} to a physical block." for i in range(60)
)
prompts = [long_prompt, "Name a primary colour.", "What is 2 + 2?"]

llm = LLM(max_num_batched_tokens=256, enable_chunked_prefill=True)
tok = llm.get_tokenizer()
outs = llm.chat([[{"role": "user", "content": p}] for p in prompts],
                SamplingParams(temperature=0, max_tokens=32))
for p, out in zip(prompts, outs):
    m = out.metrics
    print(f"{len(out.prompt_token_ids):5d} prompt tokens | TTFT {m.ttft * 1000:7.0f} ms | "
          f"{out.outputs[0].text[:60]!r}")
