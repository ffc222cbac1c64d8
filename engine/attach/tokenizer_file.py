"""``--tokenizer``: a ``tokenizer.json`` file, or a local model directory holding one.

Attach mode reads prompts and block tokens with the Rust ``tokenizers`` package (no
transformers, no model): the file every Hugging Face fast tokenizer ships. No hub
download: a name that is not a local path is an error that says so.
"""

from __future__ import annotations

from pathlib import Path

from engine.core.errors import ConfigError


def resolve_tokenizer_file(arg: str) -> str:
    """The absolute path of the ``tokenizer.json`` ``arg`` names; ConfigError otherwise."""
    p = Path(arg).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
        if not p.is_file():
            raise ConfigError(f"--tokenizer {arg}: the directory has no tokenizer.json "
                              f"(give the file, or a Hugging Face model directory that has one)")
    elif not p.is_file():
        raise ConfigError(f"--tokenizer {arg}: no such file or directory (a local tokenizer.json "
                          f"or model directory; kvscope downloads nothing)")
    try:
        from tokenizers import Tokenizer

        Tokenizer.from_file(str(p))
    except Exception as exc:
        raise ConfigError(f"--tokenizer {arg}: {p} is not a tokenizers file: {exc}") from None
    return str(p.resolve())
