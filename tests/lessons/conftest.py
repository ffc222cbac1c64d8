"""Shared fixtures: the tiny model, a private runs database, and each lesson run once."""

import pytest

from tests.tiny_models import tiny_model_dir


@pytest.fixture(scope="session")
def tiny_llama():
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="session")
def lesson_db(tmp_path_factory):
    return str(tmp_path_factory.mktemp("lessons") / "runs.sqlite")


@pytest.fixture(scope="session")
def lesson_doc(tiny_llama, lesson_db):
    """``lesson_doc(n)``: lesson n's JSON document from one run on the tiny model (cached,
    so the end-to-end test and the claim tests share a run)."""
    from lessons import get_lesson
    from lessons.runner import run_lesson

    docs = {}

    def get(n):
        if n not in docs:
            docs[n] = run_lesson(get_lesson(n), tiny_llama, db=lesson_db)
        return docs[n]

    return get


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny batches: one thread beats two on a shared CPU (the runner sets it too)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
