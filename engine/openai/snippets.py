"""Copy-paste client code for a running server: the ``openai`` package and ``curl``.

Shown on the dashboard's Submit page (for the server it is connected to) and in the
README. With a server token the snippets read it from ``$KVSCOPE_TOKEN`` rather than
printing it.
"""

from __future__ import annotations

from engine import envs

__all__ = ["curl_snippet", "python_snippet"]


def python_snippet(base_url: str, model: str, token: bool = False) -> str:
    key = f'os.environ["{envs.TOKEN.name}"]' if token else '"unused"'
    imports = "import os\n\n" if token else ""
    return (f"{imports}from openai import OpenAI\n\n"
            f'client = OpenAI(base_url="{base_url}", api_key={key})\n'
            f"stream = client.chat.completions.create(\n"
            f'    model="{model}",\n'
            f'    messages=[{{"role": "user", "content": "Why do paged KV caches waste less memory?"}}],\n'
            f"    max_tokens=64, temperature=0, stream=True,\n"
            f'    stream_options={{"include_usage": True}},\n'
            f")\n"
            f"for chunk in stream:\n"
            f"    if chunk.choices:\n"
            f'        print(chunk.choices[0].delta.content or "", end="", flush=True)\n'
            f"    else:  # the last chunk: usage, with the prefix-cache hit\n"
            f'        print("\\ncached prompt tokens:", chunk.usage.prompt_tokens_details.cached_tokens)\n')


def curl_snippet(base_url: str, model: str, token: bool = False) -> str:
    auth = f' -H "Authorization: Bearer ${envs.TOKEN.name}"' if token else ""
    body = (f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], '
            f'"max_tokens": 32}}')
    return (f"curl -s {base_url}/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
            f"  -d '{body}'")
