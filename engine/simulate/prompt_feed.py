"""Each arriving prompt's chained block hashes, made in a second process.

A fleet-scale trace's prompt hashes are a sixth of a run's CPU when the run makes them
itself: 12,000 prompts of 12k tokens each, hashed block by block (``PromptHashes``:
sha256 of a pickle per 16 tokens). Nothing in them depends on the run, so ``PromptFeed``
makes them in a child process (``python -m engine.simulate.prompt_feed``), in arrival
order, ahead of the run that reads them, on the box's other core: the same hashes
(tests/simulate/test_prompt_feed.py), the same code making them. The run makes each
prompt's tokens itself (``TracedRequest.tokens``): sending them costs the run nearly as
much as making them, and the child, making them again to hash them, then keeps ahead
of a run's burst of arrivals.

The wire: the parent writes one pickle to the child's stdin (the block size, the hash
algorithm, the requests); the child answers with one frame per request on stdout, a
4-byte little-endian length and a pickle of the prompt's hashes: a tuple of them, or, for a
Mooncake prompt, its blocks' (``PromptHashes(parts=)``): the number of a block the child
remembers, which the parent remembers under the same number (``SharedBlocks``), or the
hashes made. So the parent unpickles only new hashes, and a history re-sent in the next
turn is the same strings in both prompts, as when a run hashes them itself.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from engine.simulate.prompt_hashes import PromptHashes, SharedBlocks
from engine.simulate.trace import Trace

_LEN = struct.Struct("<I")
_PIPE_BYTES = 1 << 20
_AHEAD_BYTES = 64 << 20  # read ahead at most (~50 KB a prompt of the 12k-token trace: ~1,300)
MIN_PROMPT_TOKENS = 10_000_000  # below, a run hashes its prompts itself (starting the child: ~0.3 s)


def worth_a_process(trace: Trace) -> bool:
    """A second core, and prompts enough to pay for starting the child."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus >= 2 and sum(tr.num_prompt_tokens for tr in trace.requests) >= MIN_PROMPT_TOKENS


class PromptFeed:
    """Iterates ``(tokens, hashes)`` per request of ``trace``, in its order, the hashes made by
    a child process; ``close()`` (or the ``with`` block's end) stops the child, finished or not.

    Each take first empties the pipe into memory without waiting (up to ``_AHEAD_BYTES``
    read ahead), so the child runs ahead of the run by all it has made, not by a pipe's
    dozen prompts, and a burst of arrivals finds its prompts made. No thread: one blocked
    on the pipe gets the interpreter back only every switch interval (5 ms), slower than
    a fleet run reads prompts while they arrive."""

    def __init__(self, trace: Trace, block_size: int, hash_algo: str) -> None:
        self.trace = trace
        self.block_size = block_size
        self._shared = SharedBlocks(block_size)
        self._stderr = tempfile.TemporaryFile()  # a file: the child never blocks on what it says
        root = str(Path(__file__).resolve().parents[2])  # where this engine package is found
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen([sys.executable, "-m", "engine.simulate.prompt_feed"], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        self._buf = bytearray()  # read, not yet taken: self._buf[self._pos:]
        self._pos = 0
        self._eof = False
        try:  # the child reads all of it before it writes anything: no deadlock
            self._proc.stdin.write(pickle.dumps((block_size, hash_algo, trace.requests), pickle.HIGHEST_PROTOCOL))
            self._proc.stdin.close()
        except BrokenPipeError:  # it died at its start: the first take says why
            pass
        self._fd = self._proc.stdout.fileno()
        os.set_blocking(self._fd, False)

    def _fill(self, wait: bool) -> None:
        """Move what the pipe holds into the buffer; with ``wait``, at least some of it
        (or the end)."""
        while not self._eof and len(self._buf) - self._pos < _AHEAD_BYTES:
            try:
                chunk = os.read(self._fd, _PIPE_BYTES)
            except BlockingIOError:
                if not wait:
                    return
                select.select([self._fd], [], [])
                continue
            if not chunk:
                self._eof = True
            self._buf += chunk
            wait = False

    def _take(self, n: int, loads=pickle.loads):
        """``loads`` of the next ``n`` bytes the child wrote; None if it stopped before them."""
        self._fill(wait=False)
        while len(self._buf) - self._pos < n:
            if self._eof:
                return None
            self._fill(wait=True)
        with memoryview(self._buf) as whole, whole[self._pos:self._pos + n] as part:
            out = loads(part)
        self._pos += n
        if self._pos >= _AHEAD_BYTES // 4:  # drop what was taken
            del self._buf[:self._pos]
            self._pos = 0
        return out

    def __iter__(self) -> Iterator[tuple[list[int], tuple[str, ...]]]:
        take, length, bs, shared = self._take, _LEN.unpack, self.block_size, self._shared
        for tr in self.trace.requests:
            n = take(4, length)
            got = n and take(n[0])
            if got is None:
                raise RuntimeError(f"the prompt feed stopped early: {self._error()}")
            yield tr.tokens(), (got if isinstance(got, tuple) else shared.join(got, (tr.num_prompt_tokens - 1) // bs))

    def _error(self) -> str:
        self._proc.kill()
        status = self._proc.wait()
        self._stderr.seek(0)
        err = self._stderr.read().decode(errors="replace").strip()
        return err.splitlines()[-1] if err else f"exit status {status}"

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for f in (self._proc.stdin, self._proc.stdout, self._stderr):
            f.close()

    def __enter__(self) -> PromptFeed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve() -> None:
    """The child: read the job, write a frame per request (see the module docstring)."""
    import fcntl

    from engine.core.hashing import get_hasher

    block_size, algo, requests = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer
    try:
        fcntl.fcntl(out.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (OSError, AttributeError):  # not a pipe, or a smaller limit: the default buffer
        pass
    hashes_of = PromptHashes(get_hasher(algo), block_size)
    for tr in requests:
        parts: list = []
        hashes = hashes_of(tr, tr.tokens(), parts)
        frame = pickle.dumps(parts if parts else hashes, pickle.HIGHEST_PROTOCOL)
        out.write(_LEN.pack(len(frame)))
        out.write(frame)
    out.flush()


if __name__ == "__main__":
    _serve()
