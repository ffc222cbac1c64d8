"""KVEventsConfig: vLLM's fields and defaults, its publisher and binding rules, clear errors."""

import dataclasses

import pytest

from engine.config import EngineConfig
from engine.core import ConfigError
from engine.kv_events.config import KVEventsConfig, should_bind

VLLM_DEFAULTS = {  # vllm/config/kv_events.py
    "enable_kv_cache_events": False, "publisher": None, "endpoint": "tcp://*:5557",
    "replay_endpoint": None, "buffer_steps": 10_000, "hwm": 100_000, "max_queue_size": 100_000,
    "topic": "",
}


def test_fields_and_defaults_are_vllms_plus_encoding():
    cfg = KVEventsConfig()
    got = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    assert got == {**VLLM_DEFAULTS, "encoding": "map"}
    assert list(got)[:8] == list(VLLM_DEFAULTS)


def test_publisher_follows_vllms_rule():
    assert KVEventsConfig().effective_publisher == "null" and not KVEventsConfig().active
    on = KVEventsConfig(enable_kv_cache_events=True)
    assert on.effective_publisher == "zmq" and on.active
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").active
    assert not KVEventsConfig(publisher="zmq").active  # vLLM: disabled means nothing published


def test_the_json_a_vllm_operator_writes_parses_unchanged():
    cfg = KVEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "zmq", '
                                   '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", '
                                   '"buffer_steps": 500, "hwm": 1000, "max_queue_size": 10, "topic": "kv"}')
    assert cfg == KVEventsConfig(True, "zmq", "tcp://*:5557", "tcp://*:5558", 500, 1000, 10, "kv", "map")
    assert KVEventsConfig.coerce({"enable_kv_cache_events": True, "encoding": "array"}).encoding == "array"
    assert KVEventsConfig.coerce(cfg) is cfg and KVEventsConfig.coerce(None) is None
    assert KVEventsConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("text, match", [
    ('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}', r"unknown field\(s\) 'endpont'"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events must be true or false"),
    ('{"publisher": "kafka"}', "publisher must be one of"),
    ('{"encoding": "json"}', "encoding must be one of"),
    ('{"buffer_steps": 0}', "buffer_steps must be a positive integer"),
    ('{"hwm": -1}', "hwm must be a positive integer"),
    ('{"max_queue_size": true}', "max_queue_size must be a positive integer"),
    ('{"hwm": 1.5}', "hwm must be a positive integer"),
    ('{"topic": 3}', "topic must be a string"),
    ('{"enable_kv_cache_events": true, "endpoint": "localhost:5557"}', "must be a ZMQ endpoint"),
    ('{"enable_kv_cache_events": true, "replay_endpoint": ""}', "replay_endpoint must be"),
    ('[1, 2]', "must be a JSON object"),
    ('{"enable_kv_cache_events": tru}', "not valid JSON"),
])
def test_bad_config_gets_a_clear_error(text, match):
    with pytest.raises(ConfigError, match=match):
        KVEventsConfig.from_json(text)


def test_coerce_refuses_other_types():
    with pytest.raises(ConfigError, match="must be a KVEventsConfig, a dict or a JSON string"):
        KVEventsConfig.coerce(5)


@pytest.mark.parametrize("endpoint, bind", [
    ("tcp://*:5557", True), ("tcp://[::]:5557", True), ("tcp://::1:5557", True),
    ("ipc:///tmp/kv.sock", True), ("inproc://kv", True),
    ("tcp://127.0.0.1:5557", False), ("tcp://router.example:5557", False),
])
def test_bind_or_connect_follows_vllm(endpoint, bind):
    assert should_bind(endpoint) is bind


def test_engine_config_needs_prefix_caching_and_events_for_kv_events():
    on = KVEventsConfig(enable_kv_cache_events=True)
    with pytest.raises(ConfigError, match="need prefix caching"):
        EngineConfig(model="x", enable_prefix_caching=False, kv_events_config=on)
    with pytest.raises(ConfigError, match="need enable_events=True"):
        EngineConfig(model="x", enable_events=False, kv_events_config=on)
    with pytest.raises(ConfigError, match="must be a KVEventsConfig"):
        EngineConfig(model="x", kv_events_config={"enable_kv_cache_events": True})
    # a disabled config asks for nothing
    EngineConfig(model="x", enable_prefix_caching=False, kv_events_config=KVEventsConfig())
    cfg = EngineConfig(model="x", kv_events_config=on)
    assert cfg.to_dict()["kv_events_config"]["enable_kv_cache_events"] is True


@pytest.mark.parametrize("config, exposed", [
    ({}, ["tcp://*:5557"]),  # vLLM's default binds every interface
    ({"endpoint": "tcp://[::]:5557", "replay_endpoint": "tcp://*:5558"}, ["tcp://[::]:5557", "tcp://*:5558"]),
    ({"endpoint": "tcp://eth0:5557"}, []),  # no wildcard: connects out, a destination the operator chose
    ({"endpoint": "ipc:///tmp/kv.sock", "replay_endpoint": "tcp://127.0.0.1:5558"}, []),
    ({"endpoint": "inproc://kv", "replay_endpoint": "tcp://localhost:5558"}, []),
    ({"endpoint": "ipc:///tmp/kv.sock", "replay_endpoint": "tcp://[::1]:5558"}, []),
    ({"endpoint": "ipc:///tmp/kv.sock", "replay_endpoint": "tcp://10.0.0.5:5558"}, ["tcp://10.0.0.5:5558"]),
])
def test_network_binds_are_the_endpoints_other_machines_reach(config, exposed):
    assert KVEventsConfig(enable_kv_cache_events=True, **config).network_binds() == exposed
    assert KVEventsConfig(**config).network_binds() == []  # disabled: binds nothing


def test_a_server_binds_kv_events_beyond_loopback_only_with_allow_remote():
    from engine.server.app import ServerOptions
    from engine.server.port.security import BindRefused

    cfg = EngineConfig(model="x", kv_events_config=KVEventsConfig(enable_kv_cache_events=True))
    with pytest.raises(BindRefused, match=r"refusing to bind KV events on tcp://\*:5557.*--allow-remote"):
        ServerOptions(cfg)
    ServerOptions(cfg, allow_remote=True)  # the operator's explicit choice (the HTTP host stays loopback)
    local = KVEventsConfig(enable_kv_cache_events=True, endpoint="ipc:///tmp/kv.sock",
                           replay_endpoint="tcp://127.0.0.1:5558")
    ServerOptions(EngineConfig(model="x", kv_events_config=local))
