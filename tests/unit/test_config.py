"""kvmux.config: capacities, store specs, the connector's extra config."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kvmux.config import (
    DiskSpec,
    MemorySpec,
    StoreConnectorConfig,
    parse_capacity,
    parse_store_connector_config,
    parse_store_spec,
)
from kvmux.errors import ConfigError, KvmuxError

# -- parse_capacity ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2GiB", 2 * 2**30),
        ("500MB", 500 * 10**6),
        ("1.5KiB", 1536),
        (1024, 1024),
        (1, 1),
        ("10 b", 10),
        ("10B", 10),
        ("1024", 1024),
        ("  7  ", 7),
        ("3 kib", 3 * 1024),
        ("4MiB", 4 * 2**20),
        ("1TiB", 2**40),
        ("1KB", 1000),
        ("2GB", 2 * 10**9),
        ("1TB", 10**12),
        ("0.5GiB", 2**29),
        ("1.25 MiB", 1310720),
        (10**15, 10**15),
    ],
)
def test_parse_capacity(value: Any, expected: int) -> None:
    result = parse_capacity(value, "store.capacity")
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    "value",
    [
        "",
        "abc",
        "-1GiB",
        "0",
        "5XB",
        True,
        False,
        None,
        0,
        -5,
        "0GiB",
        "0.1",
        1.5,
        [1],
        "1 2",
        "GiB",
    ],
)
def test_parse_capacity_errors(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_capacity(value, "store.capacity")
    error = info.value
    assert error.key == "store.capacity"
    message = str(error)
    assert "'store.capacity'" in message
    assert "accepted:" in message
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"):
        assert unit in error.accepted


def test_unknown_unit_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown unit 'XB'"):
        parse_capacity("5XB", "k")


def test_config_error_is_a_value_error_and_kvmux_error() -> None:
    with pytest.raises(ValueError):
        parse_capacity("", "k")
    with pytest.raises(KvmuxError):
        parse_capacity("", "k")


def test_config_error_formatting() -> None:
    assert str(ConfigError("a.b", "broken")) == "kvmux config key 'a.b': broken"
    error = ConfigError("a.b", "broken", ["z", "y"])
    assert error.accepted == "y, z"
    assert str(error) == "kvmux config key 'a.b': broken (accepted: y, z)"
    assert ConfigError("k", "p", "one way").accepted == "one way"


@pytest.mark.parametrize("value", [2**53 + 1, "9007199254740993"], ids=["int", "str"])
def test_parse_capacity_is_exact_for_large_integers(value: Any) -> None:
    assert parse_capacity(value, "k") == 2**53 + 1


def test_parse_capacity_decimal_is_not_truncated_by_float_error() -> None:
    assert parse_capacity("1.005KB", "k") == 1005


# -- parse_store_spec --------------------------------------------------------


def test_parse_memory_spec() -> None:
    assert parse_store_spec({"type": "memory", "capacity": "2GiB"}) == MemorySpec(2 * 2**30)
    spec = parse_store_spec({"type": "memory", "capacity": 100, "name": "host-ram_1.a"})
    assert spec == MemorySpec(capacity=100, name="host-ram_1.a")


def test_parse_disk_spec(tmp_path: Path) -> None:
    spec = parse_store_spec({"type": "disk", "path": str(tmp_path), "capacity": "1MiB"})
    assert spec == DiskSpec(path=tmp_path, capacity=2**20, name="disk")
    assert isinstance(spec, DiskSpec)
    assert isinstance(spec.path, Path)


def test_disk_path_expands_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = parse_store_spec({"type": "disk", "path": "~/kv", "capacity": 1})
    assert isinstance(spec, DiskSpec)
    assert spec.path == tmp_path / "kv"


def test_unknown_store_type() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"type": "tape", "capacity": 1})
    assert info.value.key == "store.type"
    assert "'tape'" in str(info.value)
    assert "(accepted: disk, memory, redis)" in str(info.value)


def test_missing_store_type() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"capacity": 1})
    assert info.value.key == "store.type"
    assert "missing" in str(info.value)


@pytest.mark.parametrize("kind", [["memory"], {"memory": 1}])
def test_unhashable_store_type_is_a_config_error(kind: Any) -> None:
    with pytest.raises(ConfigError):
        parse_store_spec({"type": kind, "capacity": 1})


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"type": "memory", "capacity": 1, "colour": "red"}, "store.colour"),
        ({"type": "memory", "capacity": 1, "path": "/tmp/x"}, "store.path"),
        ({"type": "disk", "capacity": 1, "path": "/tmp/x", "size": 3}, "store.size"),
    ],
)
def test_unknown_store_key(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec(raw)
    assert info.value.key == key
    assert repr(key) in str(info.value)
    assert "unknown key" in str(info.value)
    assert "capacity" in info.value.accepted
    assert "type" in info.value.accepted


def test_unknown_key_uses_the_where_prefix() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"type": "memory", "capacity": 1, "colour": 1}, where="tiers[0]")
    assert info.value.key == "tiers[0].colour"


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_missing_capacity(kind: str) -> None:
    raw: dict[str, Any] = {"type": kind}
    if kind == "disk":
        raw["path"] = "/tmp/kvmux"
    with pytest.raises(ConfigError) as info:
        parse_store_spec(raw)
    assert info.value.key == "store.capacity"
    assert "missing" in str(info.value)


def test_bad_capacity_names_the_store_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"type": "memory", "capacity": "lots"})
    assert info.value.key == "store.capacity"


def test_missing_disk_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"type": "disk", "capacity": "1GiB"})
    assert info.value.key == "store.path"
    assert "missing" in str(info.value)


@pytest.mark.parametrize("path", ["", 5, None, ["/tmp"]])
def test_bad_disk_path(path: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"type": "disk", "capacity": "1GiB", "path": path})
    assert info.value.key == "store.path"


@pytest.mark.parametrize("name", ["", "has space", "a/b", 5, "x" * 65, None])
def test_bad_store_name(name: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"type": "memory", "capacity": 1, "name": name})
    assert info.value.key == "store.name"


@pytest.mark.parametrize("raw", [None, "memory", 5, ["type", "memory"]])
def test_store_spec_must_be_a_mapping(raw: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_spec(raw)
    assert info.value.key == "store"


# -- parse_store_connector_config ---------------------------------------------


def test_parse_store_connector_config() -> None:
    config = parse_store_connector_config({"store": {"type": "memory", "capacity": "1KiB"}})
    assert config == StoreConnectorConfig(store=MemorySpec(1024), fail_on_load_error=False)
    config = parse_store_connector_config(
        {"store": {"type": "memory", "capacity": 1}, "fail_on_load_error": True}
    )
    assert config.fail_on_load_error is True


@pytest.mark.parametrize("raw", [None, {}])
def test_missing_store(raw: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_connector_config(raw)
    assert info.value.key == "kv_connector_extra_config.store"
    assert "missing" in str(info.value)


def test_unknown_top_level_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_connector_config({"store": {"type": "memory", "capacity": 1}, "tiers": []})
    assert info.value.key == "kv_connector_extra_config.tiers"
    assert info.value.accepted == "fail_on_load_error, store"


@pytest.mark.parametrize("value", ["true", 1, 0, None, "yes"])
def test_fail_on_load_error_must_be_bool(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_connector_config(
            {"store": {"type": "memory", "capacity": 1}, "fail_on_load_error": value}
        )
    assert "fail_on_load_error" in info.value.key
    assert "true, false" in str(info.value)


def test_connector_config_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_connector_config(["store"])
    assert info.value.key == "kv_connector_extra_config"


def test_store_errors_inside_connector_config_name_the_store_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_connector_config({"store": {"type": "memory", "capacity": "0"}})
    assert info.value.key == "store.capacity"


# -- frozen dataclasses ----------------------------------------------------------


@pytest.mark.parametrize(
    ("instance", "field"),
    [
        (MemorySpec(1), "capacity"),
        (MemorySpec(1), "name"),
        (DiskSpec(Path("/tmp"), 1), "path"),
        (DiskSpec(Path("/tmp"), 1), "capacity"),
        (StoreConnectorConfig(MemorySpec(1)), "store"),
        (StoreConnectorConfig(MemorySpec(1)), "fail_on_load_error"),
    ],
)
def test_specs_are_frozen(instance: object, field: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, field, 2)


def test_specs_are_hashable_values() -> None:
    assert hash(MemorySpec(1)) == hash(MemorySpec(1))
    assert {DiskSpec(Path("/a"), 1), DiskSpec(Path("/a"), 1)} == {DiskSpec(Path("/a"), 1)}


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "memory", "capacity": "1GiB"},
        {"type": "disk", "path": "/tmp/kvmux-unit", "capacity": "1GiB"},
        {"type": "redis", "url": "redis://127.0.0.1:6379/0"},
    ],
)
def test_every_store_takes_a_save_queue_bound(raw: dict[str, Any]) -> None:
    assert parse_store_spec(raw).save_queue is None  # follows the engine
    assert parse_store_spec({**raw, "save_queue": "auto"}).save_queue is None
    assert parse_store_spec({**raw, "save_queue": "64MiB"}).save_queue == 64 * 2**20
    with pytest.raises(ConfigError) as info:
        parse_store_spec({**raw, "save_queue": "lots"})
    assert info.value.key == "store.save_queue"
    assert info.value.accepted.startswith('"auto" or a positive integer of bytes')


def test_signing_keys_come_from_an_environment_variable_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "k1:" + "ab" * 32
    monkeypatch.setenv("KVMUX_TEST_KEYS", secret)
    (tmp_path / "keys").write_text(secret + "\n")
    base = {"type": "disk", "path": str(tmp_path / "kv"), "capacity": "1GiB"}
    from_env = parse_store_spec({**base, "signing": {"key_env": "KVMUX_TEST_KEYS"}})
    from_file = parse_store_spec({**base, "signing": {"key_file": str(tmp_path / "keys")}})
    assert from_env.signing == from_file.signing
    assert from_env.signing is not None and from_env.signing.signing_id == "k1"
    assert "ab" * 8 not in repr(from_env)  # secrets never reach a log line
    assert parse_store_spec(base).signing is None


@pytest.mark.parametrize(
    ("signing", "key"),
    [
        ({"key_env": "KVMUX_TEST_UNSET"}, "store.signing.key_env"),
        ({"key_file": "/nonexistent/keys"}, "store.signing.key_file"),
        ({"key_env": "KVMUX_TEST_KEYS", "key_file": "/x"}, "store.signing"),
        ({"key_id": "k1"}, "store.signing.key_id"),
        ("KVMUX_TEST_KEYS", "store.signing"),
        ({"key_env": "KVMUX_TEST_BAD"}, "store.signing.key_env"),
    ],
)
def test_bad_signing_config_names_the_key(
    signing: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVMUX_TEST_UNSET", raising=False)
    monkeypatch.setenv("KVMUX_TEST_KEYS", "k1:" + "ab" * 32)
    monkeypatch.setenv("KVMUX_TEST_BAD", "k1:short")
    with pytest.raises(ConfigError) as info:
        parse_store_spec({"type": "memory", "capacity": "1GiB", "signing": signing})
    assert info.value.key == key


# -- offload_prompt_only -------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "memory", "capacity": "1MiB"},
        {"type": "disk", "path": "/tmp/kvmux-unit", "capacity": "1MiB"},
        {"type": "redis", "url": "redis://localhost:6379"},
    ],
)
def test_every_store_saves_prompt_blocks_only_by_default(raw: dict[str, Any]) -> None:
    assert parse_store_spec(raw).offload_prompt_only is True
    assert parse_store_spec({**raw, "offload_prompt_only": False}).offload_prompt_only is False


@pytest.mark.parametrize("value", ["false", 0, None, "no"])
def test_offload_prompt_only_must_be_a_boolean(value: Any) -> None:
    raw = {"type": "memory", "capacity": "1MiB", "offload_prompt_only": value}
    with pytest.raises(ConfigError) as info:
        parse_store_connector_config({"store": raw})
    assert "store.offload_prompt_only" in str(info.value)
    assert "true, false" in str(info.value)


def test_an_epoch_is_text_the_operator_sets() -> None:
    raw = {"type": "disk", "path": "/tmp/kvmux-unit", "capacity": "1MiB"}
    assert parse_store_spec(raw).epoch == ""
    assert parse_store_spec({**raw, "epoch": "2026-12-07"}).epoch == "2026-12-07"
    for bad in (7, "x" * 129, None):
        with pytest.raises(ConfigError) as info:
            parse_store_connector_config({"store": {**raw, "epoch": bad}})
        assert "store.epoch" in str(info.value)
