"""The Submit form's checks: every out-of-range field gets its own message with the
allowed range; nothing empty or too big is sent."""

from __future__ import annotations

from dashboard import palette
from dashboard.submit_form import frame_bytes, validate

CFG = {"max_model_len": 2048}
LIMITS = {"max_n": 64, "max_frame_bytes": 1 << 20}
OK = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 48, "n": 1}


def check(mode="Prompt", prompt="hello", system="", user="hi", count=None, **params):
    return validate(mode, prompt, system, user, {**OK, **params}, CFG, LIMITS, count)


def test_a_good_request_passes():
    assert check() == {} and check("Chat", prompt="") == {}


def test_out_of_range_numbers_say_their_range_beside_their_field():
    e = check(max_tokens=0, n=100, top_k=-3)
    assert set(e) == {"max_tokens", "n", "top_k"}
    assert "from 1 to 2047" in e["max_tokens"] and "got 0" in e["max_tokens"]
    assert "from 1 to 64" in e["n"] and "got 100" in e["n"]
    assert set(check(max_tokens=2048)) == {"max_tokens"}
    assert set(check(max_tokens=4.5)) == {"max_tokens"}


def test_empty_inputs_are_refused_in_both_modes():
    assert set(check(prompt="   ")) == {"prompt"}
    assert set(check("Chat", system="", user=" ")) == {"user"}
    assert set(check("Chat", system="You are terse.", user="")) == {"user"}


def test_a_paste_past_the_frame_limit_is_caught_before_sending():
    big = "x" * (2 << 20)  # 2 MB
    e = check(prompt=big)
    assert set(e) == {"size"} and "2.0 MB" in e["size"] and "1.0 MB" in e["size"]
    assert frame_bytes(big, None, OK) > 2 << 20
    assert set(check("Chat", user=big)) == {"size"}
    # with the engine's tokenizer, a prompt too long for max_model_len is caught too
    e = check(prompt="word " * 500, count=lambda t: len(t.split()) * 4, max_tokens=100)
    assert set(e) == {"size"} and "2000 tokens" in e["size"]


def test_one_colour_per_concept_across_pages():
    assert palette.color_for("preempted (waiting to recompute)") == palette.PREEMPTED
    assert palette.color_for("num_requests_waiting") == palette.WAITING
    assert palette.color_for("hit tokens") == palette.HIT
    assert palette.color_for("copy-on-write copies") == palette.COW_COPY
    assert palette.color_for("evicted") == palette.EVICTION == palette.MISS_COLORS["evicted"]
    assert palette.color_for("tokens/s") is None
    colours = [palette.HIT, palette.MISS_COLORS["cold"], palette.MISS_COLORS["partial"],
               palette.EVICTION, palette.WAITING, palette.PREEMPTED]
    assert len(set(colours)) == len(colours)  # hit, cold, partial, evicted, waiting, preempted


def test_lesson_bars_have_a_categorical_axis():
    from dashboard.lessons_page import chart_figure

    fig = chart_figure({"kind": "bars", "title": "t", "categories": ["8", "16", "32", "64"],
                        "series": [{"name": "hit rate (%)", "values": [1, 2, 3, 4]}]})
    assert fig.layout.xaxis.type == "category"
    assert fig.data[0].marker.color == palette.HIT
