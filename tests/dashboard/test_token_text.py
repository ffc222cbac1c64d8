"""Hovers decode block tokens with the run's tokenizer file, torch-free."""

from dashboard.blocks import grid_data
from dashboard.token_text import token_text_for
from tests.core.driver import make_scheduler, req, step
from tests.tiny_models import tiny_model_dir


def test_token_text_from_the_run_config_tokenizer_file():
    path = tiny_model_dir("llama") / "tokenizer.json"
    decode = token_text_for({"tokenizer_file": str(path)})
    assert decode is not None
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode("the cat sat").ids
    assert decode(ids) == "the cat sat"
    assert token_text_for({"tokenizer_file": "/nonexistent/tokenizer.json"}) is None
    assert token_text_for({}) is None


def test_grid_hover_shows_the_text_of_a_cached_block():
    path = tiny_model_dir("llama") / "tokenizer.json"
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode("the cat sat on the mat and more").ids
    s = make_scheduler(block_size=4, num_blocks=16, max_model_len=64)
    s.add_request(req("a", ids, max_tokens=1))
    step(s)
    data = grid_data(s.snapshot(), [], token_text_for({"tokenizer_file": str(path)}))
    assert s.kv.pool.blocks[0].hash is not None  # a's first block, freed but cached
    first_block_text = Tokenizer.from_file(str(path)).decode(ids[:4], skip_special_tokens=False)
    assert "text: " + repr(first_block_text)[:20] in data.hover[0]
