"""kvmux.config: MuxConnector's extra config (test_config.py covers StoreConnector's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvmux.config import (
    INHERITED,
    POLICIES,
    ChildConfig,
    MuxConfig,
    parse_mux_config,
    parse_store_spec,
    store_child,
)
from kvmux.errors import ConfigError

MEMORY = {"type": "memory", "capacity": "1MiB"}
DISK = {"type": "disk", "path": "/tmp/kvmux-unit-disk", "capacity": "1GiB"}
EXAMPLE = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"x": 1}}
PARENT = {
    "engine_id": "engine-1",
    "kv_role": "kv_both",
    "kv_buffer_device": "cpu",
    "kv_load_failure_policy": "fail",
}


def parse(inherited: dict[str, Any] | None = None, **extra: Any) -> MuxConfig:
    return parse_mux_config(extra, PARENT if inherited is None else inherited)


def labels(config: MuxConfig) -> list[str]:
    return [c.label for c in config.children]


# -- children ----------------------------------------------------------------------


def test_tiers_become_store_children_before_connectors() -> None:
    config = parse(connectors=[EXAMPLE], tiers=[MEMORY, DISK])
    assert labels(config) == ["0:memory", "1:disk", "2:ExampleConnector"]
    memory, disk, example = (c.fields for c in config.children)
    for fields, spec in ((memory, MEMORY), (disk, DISK)):
        assert fields["kv_connector"] == "StoreConnector"
        assert fields["kv_connector_module_path"] == "kvmux.vllm"
        assert fields["kv_connector_extra_config"] == {"store": spec}
    assert example["kv_connector"] == "ExampleConnector"
    assert example["kv_connector_extra_config"] == {"x": 1}


def test_store_child_copies_the_spec() -> None:
    spec = dict(MEMORY)
    fields = store_child(spec)
    spec["capacity"] = "2MiB"
    assert fields == {
        "kv_connector": "StoreConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_connector_extra_config": {"store": MEMORY},
    }


def test_named_tiers_and_explicit_store_children_are_labelled_by_store_name() -> None:
    named = {**MEMORY, "name": "hot"}
    explicit = store_child({**DISK, "name": "cold"})
    config = parse(tiers=[named], connectors=[explicit, {"kv_connector": "StoreConnector"}])
    assert labels(config) == ["0:hot", "1:cold", "2:StoreConnector"]


def test_only_connectors_or_only_tiers() -> None:
    assert labels(parse(connectors=[EXAMPLE, EXAMPLE])) == [
        "0:ExampleConnector",
        "1:ExampleConnector",
    ]
    assert labels(parse(tiers=[MEMORY])) == ["0:memory"]


@pytest.mark.parametrize("name", INHERITED)
def test_inherited_fields_are_copied_unless_the_child_sets_its_own(name: str) -> None:
    own = {"kv_connector": "ExampleConnector", name: "child-value"}
    config = parse(connectors=[EXAMPLE, own], tiers=[MEMORY])
    tier, inheriting, setting = (c.fields for c in config.children)
    assert tier[name] == PARENT[name]
    assert inheriting[name] == PARENT[name]
    assert setting[name] == "child-value"


def test_inherited_none_values_are_not_copied() -> None:
    config = parse({"engine_id": None, "kv_role": "kv_consumer"}, connectors=[EXAMPLE])
    fields = config.children[0].fields
    assert "engine_id" not in fields
    assert fields["kv_role"] == "kv_consumer"


def test_inherited_fields_do_not_leak_into_the_input() -> None:
    child = dict(EXAMPLE)
    parse(connectors=[child])
    assert child == EXAMPLE


def test_defaults() -> None:
    config = parse(tiers=[MEMORY])
    assert config.policy == "first"
    assert config.breaker_seconds == 5.0
    assert config.breaker_max_seconds == 60.0
    assert config.fail_on_load_error is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.policy = "longest"  # type: ignore[misc]
    assert isinstance(config.children[0], ChildConfig)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy(policy: str) -> None:
    assert parse(tiers=[MEMORY], policy=policy).policy == policy


def test_numbers_and_flag() -> None:
    config = parse(
        tiers=[MEMORY], breaker_seconds=1, breaker_max_seconds=2.5, fail_on_load_error=True
    )
    assert config.breaker_seconds == 1.0
    assert type(config.breaker_seconds) is float
    assert config.breaker_max_seconds == 2.5
    assert config.fail_on_load_error is True


# -- errors ----------------------------------------------------------------------------


def error_of(raw: Any, inherited: dict[str, Any] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_mux_config(raw, PARENT if inherited is None else inherited)
    return info.value


@pytest.mark.parametrize("raw", [{}, {"connectors": []}, {"tiers": [], "connectors": []}])
def test_no_children(raw: dict[str, Any]) -> None:
    err = error_of(raw)
    assert err.key == "connectors"
    assert "at least one child" in str(err)
    assert "tiers" in err.accepted and "connectors" in err.accepted


def test_unknown_policy_lists_the_policies() -> None:
    err = error_of({"tiers": [MEMORY], "policy": "fastest"})
    assert err.key == "policy"
    assert "'fastest'" in str(err)
    for policy in ("first", "longest", "compose"):
        assert policy in err.accepted
        assert policy in str(err)


def test_unknown_key_is_named() -> None:
    err = error_of({"tiers": [MEMORY], "polcy": "first"})
    assert err.key == "polcy"
    assert "'polcy'" in str(err)
    assert "policy" in err.accepted and "tiers" in err.accepted


def test_not_a_mapping() -> None:
    assert error_of(["tiers"]).key == "kv_connector_extra_config"
    assert error_of(None).key == "kv_connector_extra_config"


@pytest.mark.parametrize(
    "child", [{}, {"kv_role": "kv_both"}, {"kv_connector": ""}, {"kv_connector": None}, "X"]
)
def test_child_without_kv_connector(child: Any) -> None:
    err = error_of({"connectors": [EXAMPLE, child]})
    assert err.key == "connectors[1].kv_connector"
    assert "connectors[1].kv_connector" in str(err)


@pytest.mark.parametrize(
    ("tier", "key"),
    [
        ({"type": "ssd", "capacity": "1MiB"}, "tiers[1].type"),
        ({"capacity": "1MiB"}, "tiers[1].type"),
        ({"type": "memory"}, "tiers[1].capacity"),
        ({"type": "memory", "capacity": "lots"}, "tiers[1].capacity"),
        ({"type": "memory", "capacity": "1MiB", "size": 3}, "tiers[1].size"),
        ({"type": "disk", "capacity": "1MiB"}, "tiers[1].path"),
        ({"type": "memory", "capacity": "1MiB", "name": "a b"}, "tiers[1].name"),
        ("memory", "tiers[1]"),
    ],
)
def test_bad_tier_spec(tier: Any, key: str) -> None:
    err = error_of({"tiers": [MEMORY, tier]})
    assert err.key == key
    assert key in str(err)


@pytest.mark.parametrize(("key", "value"), [("tiers", MEMORY), ("connectors", EXAMPLE)])
def test_lists_must_be_lists(key: str, value: Any) -> None:
    assert error_of({key: value}).key == key


@pytest.mark.parametrize("key", ["breaker_seconds", "breaker_max_seconds"])
@pytest.mark.parametrize("value", [0, -1, -0.5, "5", None, True, [5]])
def test_bad_breaker_seconds(key: str, value: Any) -> None:
    err = error_of({"tiers": [MEMORY], key: value})
    assert err.key == key
    assert repr(value) in str(err)


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "true"])
def test_non_bool_fail_on_load_error(value: Any) -> None:
    err = error_of({"tiers": [MEMORY], "fail_on_load_error": value})
    assert err.key == "fail_on_load_error"
    assert "true" in err.accepted and "false" in err.accepted


def test_config_error_is_a_value_error() -> None:
    assert isinstance(error_of({}), ValueError)


def test_a_tier_may_save_generated_blocks() -> None:
    tier = {**MEMORY, "offload_prompt_only": False}
    store = parse(tiers=[tier]).children[0].fields["kv_connector_extra_config"]["store"]
    assert parse_store_spec(store, "tiers[0]").offload_prompt_only is False
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.offload_prompt_only"):
        parse(tiers=[{**MEMORY, "offload_prompt_only": "yes"}])
