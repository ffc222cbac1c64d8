"""Reading tensors from an HF checkpoint directory (safetensors, sharded or not, or .bin)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from engine.model.base import TensorGetter


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's weight files, safetensors preferred."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        files = sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(
            f"no weights in {path}: expected *.safetensors or pytorch_model*.bin"
        )
    return files


@contextlib.contextmanager
def open_checkpoint(path: Path) -> Iterator[TensorGetter]:
    """Yield get(hf_name) -> tensor | None over all weight files in `path`.

    Old checkpoints (e.g. OPT's .bin) omit the leading "model." prefix, so a name is
    tried with and without it.
    """
    files = weight_files(path)
    with contextlib.ExitStack() as stack:
        if files[0].suffix == ".safetensors":
            handles = [stack.enter_context(safe_open(str(f), framework="pt")) for f in files]
            index = {name: h for h in handles for name in h.keys()}

            def read(name: str) -> torch.Tensor:
                return index[name].get_tensor(name)
        else:
            tensors: dict[str, torch.Tensor] = {}
            for f in files:
                tensors.update(torch.load(f, map_location="cpu", weights_only=True))
            index = tensors
            read = tensors.__getitem__

        def get(name: str) -> torch.Tensor | None:
            for candidate in (name, name.removeprefix("model.")):
                if candidate in index:
                    return read(candidate)
            return None

        yield get
