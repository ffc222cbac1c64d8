"""lm-eval (``local-completions``) against ``kvscope serve`` and the real ``vllm serve``.

Two local tasks (tests/vllm/lm_eval_tasks/: JSON data, ``dataset_path: json``; nothing comes
from a hub): a loglikelihood one (multiple choice: lm-eval sends each context + choice as
token ids with ``echo: true, logprobs: 1, max_tokens: 1`` and sums the prompt logprobs of
the choice's tokens) and a generate-until one (greedy, until a newline). The tokenizer is
the local HF directory both servers load. vLLM is evaluated first (its answers all in),
then kvscope: never both busy. Every loglikelihood must agree to 1e-3 (float32 CPU
kernels: measured differences are ~1e-5), every greedy flag and generated answer exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.vllm_servers import MODEL_NAME

pytestmark = pytest.mark.vllm

TASKS = Path(__file__).resolve().parent / "lm_eval_tasks"
TOLERANCE = 1e-3


def _task_dir(tmp: Path) -> Path:
    """The task YAMLs with their data paths made absolute (datasets reads them from cwd)."""
    out = tmp / "lm_eval_tasks"
    out.mkdir(exist_ok=True)
    for y in TASKS.glob("*.yaml"):
        (out / y.name).write_text(y.read_text().replace("{DATA}", str(TASKS)))
    return out


def evaluate(base_url: str, hf_dir: str, tmp: Path, monkeypatch) -> dict[str, list]:
    """Per task, per document in order: its responses (loglikelihood: [(ll, is_greedy)]
    per choice; generate-until: [text])."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp / "hf-datasets"))
    import lm_eval
    from lm_eval.tasks import TaskManager

    res = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": MODEL_NAME, "base_url": f"{base_url}/v1/completions",
                    "tokenizer_backend": "huggingface", "tokenizer": hf_dir,
                    "num_concurrent": 1, "max_retries": 1, "timeout": 300},
        tasks=["kvscope_mc", "kvscope_gen"], task_manager=TaskManager(include_path=str(_task_dir(tmp))),
        log_samples=True, batch_size=1, bootstrap_iters=0)
    shutil.rmtree(tmp / "hf-datasets", ignore_errors=True)
    return {task: [s["resps"] for s in sorted(samples, key=lambda s: s["doc_id"])]
            for task, samples in res["samples"].items()}


@pytest.fixture(scope="module")
def vllm_results(vllm_server, model_dir, tmp_path_factory, request):
    mp = pytest.MonkeyPatch()
    try:
        return evaluate(vllm_server.base_url, model_dir, tmp_path_factory.mktemp("lm-eval-vllm"), mp)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def kvscope_results(vllm_results, kvscope_servers, model_dir, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        return evaluate(kvscope_servers().base_url, model_dir, tmp_path_factory.mktemp("lm-eval-kv"), mp)
    finally:
        mp.undo()


def _loglikelihoods(results) -> list[list[tuple[float, bool]]]:
    return [[tuple(r[0]) for r in doc] for doc in results["kvscope_mc"]]


def test_loglikelihoods_equal_vllms(vllm_results, kvscope_results):
    ours, theirs = _loglikelihoods(kvscope_results), _loglikelihoods(vllm_results)
    assert [len(d) for d in ours] == [len(d) for d in theirs] == [3, 2, 3, 3, 2]
    worst = max(abs(a[0] - b[0]) for da, db in zip(ours, theirs) for a, b in zip(da, db))
    print(f"lm-eval loglikelihood: largest |kvscope - vLLM| = {worst:.2e} over "
          f"{sum(map(len, ours))} choices")
    for da, db in zip(ours, theirs):
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(da, db):
            assert ll_a == pytest.approx(ll_b, abs=TOLERANCE)
            assert greedy_a == greedy_b
    assert all(ll < 0 for d in ours for ll, _ in d)


def test_generate_until_answers_equal_vllms(vllm_results, kvscope_results):
    ours = [doc[0][0] for doc in kvscope_results["kvscope_gen"]]
    theirs = [doc[0][0] for doc in vllm_results["kvscope_gen"]]
    assert len(ours) == 4 and ours == theirs
    assert all("\n" not in a for a in ours)  # cut at the stop string
