"""The wire dialect and the wire doctor on hand-written msgpack (pure)."""

from __future__ import annotations

import msgspec

from engine.attach.fleet import completeness, pod_row
from engine.attach.wire import dialect, dialect_key, explain

enc = msgspec.msgpack.encode


def test_dialects_of_each_engine_generation():
    old = enc([1.0, [["BlockStored", [1, 2], None, [5] * 8, 4, None, "GPU", None]], 0])  # vLLM <= 0.23
    assert dialect(old, 2) == {"frames": 2, "batch": "array", "events": "array", "hashes": "int",
                               "fields": "common"}
    new = enc([1.0, [{"type": "BlockStored", "block_hashes": [b"\x01" * 32], "parent_block_hash": None,
                      "token_ids": [1, 2], "block_size": 2, "group_idx": 0},
                     {"type": "BlockRemoved", "block_hashes": [7]}], 0])
    d = dialect(new, 3)
    assert (d["events"], d["hashes"], d["fields"]) == ("map", "mixed", "vllm-0.3x")
    sg = enc({"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": [3], "parent_block_hash": None,
                                     "token_ids": [], "block_size": 0, "medium": "CPU_PINNED"}]})
    d = dialect(sg, 2)
    assert (d["batch"], d["fields"]) == ("map", "sglang")
    assert dialect_key(dialect(enc([1.0, []]), 3)) == "events none · hashes none · 3 frames · fields common"
    assert dialect_key(dialect(b"\xc1", 3)) == "undecodable · 3 frames"


def test_the_wire_doctor_names_fields_and_marks_unknown_ones():
    payload = enc([2.5, [["BlockRemoved", [b"\xab" * 32], "GPU", 1, None, None, "surprise"]], 3, "extra"])
    rows = {r["path"]: (r["type"], r["value"]) for r in explain(payload)}
    assert rows["ts"] == ("float", "2.5") and rows["data_parallel_rank"] == ("int", "3")
    assert rows["#3 (unknown)"] == ("str", "extra")
    assert rows["events[0]"] == ("str", "tagged array of 7")
    assert rows["events[0].block_hashes"][1].startswith("1 × bin: abababab")
    assert rows["events[0].group_idx"] == ("int", "1")
    assert rows["events[0].#6 (unknown)"] == ("str", "surprise")
    assert explain(b"\xc1")[0]["type"] == "error"


def test_a_row_without_a_subscription_or_a_fold():
    assert completeness(0, 0) is None and completeness(3, 1) == 0.75
    row = pod_row({}, None, None)
    assert (row["received"], row["cached_blocks"], row["completeness"], row["evicted_per_min"]) == (0, 0, None, 0.0)
