"""Issue 17 "pruning": the RequestBook's memory of used ids is bounded, with the
duplicate guarantee it states (on main at 7416b2c the set grew by every id of a run)."""

from engine.core.sampling_params import SamplingParams
from tests.server.door import ListSink

P = SamplingParams()


def test_used_ids_are_remembered_up_to_the_bound_and_live_ones_always():
    from engine.server.worker.request_book import RequestBook

    book, sink = RequestBook(max_in_flight_per_sink=10, remember=3), ListSink(1)
    book.add("live", sink, {})  # stays live throughout
    for rid in ("a", "b", "c"):
        book.add(rid, sink, {})
        book.release(rid)
    assert book.refuse(sink, "live", P).code == "duplicate_request_id"  # live: always refused
    for rid in ("a", "b", "c"):  # the newest `remember` finished ids are refused
        assert book.refuse(sink, rid, P).code == "duplicate_request_id"
    book.add("d", sink, {})
    book.release("d")
    assert book.refuse(sink, "a", P) is None  # the oldest may come again
    assert book.refuse(sink, "b", P).code == "duplicate_request_id"
    book.release("live")
    assert book.refuse(sink, "live", P) is None  # bounded: "live" was forgotten as the oldest
    book.new_run()
    assert all(book.refuse(sink, rid, P) is None for rid in ("b", "c", "d"))  # a new run forgets all
