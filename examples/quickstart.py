"""Sample four prompts (temperature 0.7, top_p 0.95), as in vLLM's quick-start.

    python examples/quickstart.py
"""

from engine import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
params = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=128, stop=["\n"], seed=0)

llm = LLM()  # SmolLM2-135M-Instruct, on the CPU unless a GPU is present
for out in llm.generate(prompts, params):
    print(f"Prompt: {out.prompt!r}, Generated text: {out.outputs[0].text!r}")
