"""Prompts that share a long prefix, with prefix caching on; prints the hit rate.

    python examples/prefix_caching.py
"""

from engine import LLM, SamplingParams

system = ("You are a patient tutor who explains how operating systems manage memory. "
          "Use short sentences and one concrete example. ") * 4
questions = ["What is a page table?", "What is fragmentation?", "Why use fixed-size blocks?",
             "What does copy-on-write save?"]

llm = LLM(enable_prefix_caching=True)
params = SamplingParams(temperature=0, max_tokens=24)
first = llm.chat([{"role": "system", "content": system}, {"role": "user", "content": questions[0]}], params)
rest = llm.chat([[{"role": "system", "content": system}, {"role": "user", "content": q}]
                 for q in questions[1:]], params)
for out in first + rest:
    print(f"{out.num_cached_tokens:4d}/{len(out.prompt_token_ids)} prompt tokens from cache | "
          f"{out.outputs[0].text[:50]!r}")
s = llm.stats()
print(f"prefix cache hit rate: {s['prefix_cache_hits']}/{s['prefix_cache_queries']} tokens "
      f"= {s['prefix_cache_hit_rate']:.1%}")
