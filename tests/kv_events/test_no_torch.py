"""engine.kv_events imports neither torch nor transformers: attach mode and other torch-free
readers (the dashboard's side) use its decoder, and a publisher needs only the core's events."""

from tests.core.test_no_torch import assert_imports_without_torch


def test_kv_events_import_without_torch():
    assert_imports_without_torch("import engine.config\n"
                                 "import engine.kv_events.decoder, engine.kv_events.publisher, "
                                 "engine.kv_events.replay")
